"""Interleaved A/B of the torch backend's gathered decode branches by CPU time (issue 32).

`python -m benchmarks.decode_attention_ab --json out.json`: for each batch shape (this model's
G=4 kv heads, R=2, d=32, blocks of 16, the blocks of every sequence scattered at random), one
`decode_gathered` call per branch forced by the module's bounds (`sdpa`: fused attention on the
strided gathered views; `copy`: K/V copied to [S, G, L, d] then two matmuls), the branches
interleaved in every
round, each timed over `--calls` calls by `time.process_time` (a loaded machine's other processes
do not count, its cache and memory-bandwidth contention still does). Every branch's output is
checked against the reference first.

`--contiguous`: instead, batch 1 with consecutive blocks (the backend's view path): the previous
`decode_contiguous` (two matmuls, scale, softmax; kept here as `view_matmul`) against the current
one (one fused call on the strided views, `view_sdpa`), per context length in `--contexts`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import moe.attention.paged_torch_decode as ptd
from kernels.paged_attention import paged_attention_decode_torch
from moe.attention.paged_torch import decode_contiguous

BRANCHES = {"sdpa": 1 << 40, "copy": -1}  # the SDPA_MAX_GATHERED that sends every call down that branch


def make_case(S: int, lo: int, hi: int, G: int, R: int, d: int, bs: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    W = -(-hi // bs)
    n = S * W + 8
    kc, vc = torch.randn(n, bs, G, d, generator=g), torch.randn(n, bs, G, d, generator=g)
    bt = torch.randperm(n, generator=g)[:S * W].view(S, W).int()
    cl = torch.randint(lo, hi + 1, (S,), generator=g, dtype=torch.int32)
    return torch.randn(S, G * R, d, generator=g), kc, vc, bt, cl


def run_branch(name, case, ws):
    ptd.SDPA_MAX_GATHERED = BRANCHES[name]
    return ptd.decode_gathered(*case, 0.17, ws)


def view_matmul(q, k_cache, v_cache, first_slot: int, context_len: int, scale: float) -> torch.Tensor:
    """`moe.attention.paged_torch.decode_contiguous` before this change (commit cee8cfd)."""
    _, H, d = q.shape
    G = k_cache.shape[2]
    k_LGd = k_cache.view(-1, G, d)[first_slot:first_slot + context_len].float()
    v_LGd = v_cache.view(-1, G, d)[first_slot:first_slot + context_len].float()
    scores_GRL = torch.matmul(q.reshape(G, H // G, d).float(), k_LGd.permute(1, 2, 0)) * scale
    out_GRd = torch.matmul(torch.softmax(scores_GRL, dim=-1), v_LGd.transpose(0, 1))
    return out_GRd.reshape(1, H, d).to(q.dtype)


def contiguous_ab(contexts, rounds: int, calls: int) -> list:
    fns = {"view_matmul": view_matmul, "view_sdpa": decode_contiguous}
    g = torch.Generator().manual_seed(0)
    kc, vc = torch.randn(40, 16, 4, 32, generator=g), torch.randn(40, 16, 4, 32, generator=g)
    q = torch.randn(1, 8, 32, generator=g)
    results = []
    for ctx in contexts:
        ref = paged_attention_decode_torch(q, kc, vc, torch.arange(2, 40, dtype=torch.int32)[None],
                                           torch.tensor([ctx], dtype=torch.int32), 0.17)
        for f in fns.values():
            torch.testing.assert_close(f(q, kc, vc, 32, ctx, 0.17), ref, rtol=1e-5, atol=1e-5)
        us = {n: [] for n in fns}
        for _ in range(rounds):
            for n, f in fns.items():
                t = time.process_time()
                for _ in range(calls):
                    f(q, kc, vc, 32, ctx, 0.17)
                us[n].append((time.process_time() - t) / calls * 1e6)
        results.append({"batch": 1, "context": ctx, "us_per_call": us,
                        "median_us": {n: statistics.median(v) for n, v in us.items()}})
        print(f"S=1 ctx {ctx}: " + ", ".join(
            f"{n} {statistics.median(v):.1f} us ({min(v):.1f}-{max(v):.1f})" for n, v in us.items()), flush=True)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["8:60:90", "16:60:90", "32:20:190", "64:60:90", "64:200:500",
                                                    "8:1000:2000", "128:60:90"],
                    help="batch:min_context:max_context")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--json", default=None)
    ap.add_argument("--contiguous", action="store_true", help="batch 1, consecutive blocks (see the docstring)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[20, 80, 190])
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.contiguous:
        with torch.inference_mode():
            results = contiguous_ab(args.contexts, args.rounds, args.calls)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rounds": args.rounds, "calls": args.calls, "torch": torch.__version__, "results": results},
                          f, indent=1)
        return 0
    saved = ptd.SDPA_MAX_GATHERED
    results = []
    try:
        with torch.inference_mode():
            for i, shape in enumerate(args.shapes):
                S, lo, hi = map(int, shape.split(":"))
                case = make_case(S, lo, hi, G=4, R=2, d=32, bs=16, seed=i)
                ref = paged_attention_decode_torch(*case, 0.17)
                ws = {n: ptd.DecodeWorkspace() for n in BRANCHES}
                for n in BRANCHES:
                    torch.testing.assert_close(run_branch(n, case, ws[n]), ref, rtol=1e-5, atol=1e-5)
                us = {n: [] for n in BRANCHES}
                for _ in range(args.rounds):
                    for n in BRANCHES:
                        t = time.process_time()
                        for _ in range(args.calls):
                            run_branch(n, case, ws[n])
                        us[n].append((time.process_time() - t) / args.calls * 1e6)
                row = {"batch": S, "context": [lo, hi], "us_per_call": us,
                       "median_us": {n: statistics.median(v) for n, v in us.items()}}
                results.append(row)
                print(f"S={S} ctx {lo}-{hi}: " + ", ".join(
                    f"{n} {statistics.median(v):.1f} us ({min(v):.1f}-{max(v):.1f})" for n, v in us.items()), flush=True)
    finally:
        ptd.SDPA_MAX_GATHERED = saved
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": args.rounds, "calls": args.calls, "torch": torch.__version__, "results": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
