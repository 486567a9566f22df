"""Interleaved A/B of the torch backend's two prefill paths by CPU time (issue 32).

`python -m benchmarks.prefill_attention_ab --json out.json`: for each case (S sequences, each with a
random number of queries in [qlo, qhi] after a random cached prefix of [plo, phi] tokens, blocks of
16 scattered at random; G=4 kv heads of R=2 queries, `--head-dim` 32 for the tiny model, 64 for
`small`), one call of each path: `padded` (`paged_attention_prefill_torch`, einsums over [S, max_q,
max_kv]) and `loop` (`paged_attention_prefill_sdpa`, one sequence at a time through fused attention),
interleaved in every round, each timed over `--calls` calls by `time.process_time`. The loop's output
is checked against the padded reference first (fp32, within 1e-5; exit 1 if it differs). Each row also names the path
`TorchPagedAttention.prefill` takes for that case, and whether it is the cheaper one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from kernels.paged_attention.reference import paged_attention_prefill_torch
import moe.attention.paged_torch as pt
from moe.attention.paged_torch import TorchPagedAttention, paged_attention_prefill_sdpa

PATHS = {"padded": paged_attention_prefill_torch, "loop": paged_attention_prefill_sdpa}
CASES = ["1:48:48:0:0", "1:12:12:0:0", "1:64:64:0:0", "1:100:100:200:200", "2:20:40:0:0", "4:2:30:0:90",
         "8:8:64:0:0", "32:8:64:0:0", "16:1:1:20:35", "16:3:3:20:35", "16:4:4:40:55", "16:8:8:40:55",
         "16:16:16:40:55"]


def make_case(spec: str, d: int, seed: int, G: int = 4, R: int = 2, bs: int = 16):
    S, qlo, qhi, plo, phi = map(int, spec.split(":"))
    g = torch.Generator().manual_seed(seed)
    q_lens = torch.randint(qlo, qhi + 1, (S,), generator=g)
    ctx = q_lens + torch.randint(plo, phi + 1, (S,), generator=g)
    W = int(-(-ctx.max() // bs))
    n = S * W + 8
    kc, vc = torch.randn(n, bs, G, d, generator=g), torch.randn(n, bs, G, d, generator=g)
    bt = torch.randperm(n, generator=g)[:S * W].view(S, W).int()
    cu = torch.cat([torch.zeros(1, dtype=torch.long), q_lens.cumsum(0)]).int()
    q = torch.randn(int(cu[-1]), G * R, d, generator=g)
    return (q, kc, vc, bt, cu, ctx.int(), d ** -0.5), int(q_lens.max())


def chosen_path(case, max_q: int) -> str:
    """The path `TorchPagedAttention.prefill` takes for this case (it is called, each path spied on)."""
    used, saved = [], (pt.paged_attention_prefill_torch, pt.paged_attention_prefill_sdpa)
    pt.paged_attention_prefill_torch = lambda *a: used.append("padded") or saved[0](*a)
    pt.paged_attention_prefill_sdpa = lambda *a: used.append("loop") or saved[1](*a)
    try:
        TorchPagedAttention().prefill(*case, max_q)
    finally:
        pt.paged_attention_prefill_torch, pt.paged_attention_prefill_sdpa = saved
    return used[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=CASES, help="S:qlo:qhi:prefix_lo:prefix_hi")
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results, bad = [], 0
    with torch.inference_mode():
        for i, spec in enumerate(args.cases):
            case, max_q = make_case(spec, args.head_dim, seed=i)
            extras = {"padded": [max_q], "loop": []}
            err = (paged_attention_prefill_sdpa(*case) - paged_attention_prefill_torch(*case, max_q)).abs().max().item()
            if err > 1e-5:
                print(f"FAILED: the loop differs from the padded reference by {err:.2e} on {spec}", file=sys.stderr)
                bad += 1
            us = {n: [] for n in PATHS}
            for _ in range(args.rounds):
                for name, fn in PATHS.items():
                    t = time.process_time()
                    for _ in range(args.calls):
                        fn(*case, *extras[name])
                    us[name].append((time.process_time() - t) / args.calls * 1e6)
            med = {n: statistics.median(v) for n, v in us.items()}
            chosen = chosen_path(case, max_q)
            row = {"case": spec, "queries": case[0].shape[0], "us_per_call": us, "median_us": med,
                   "loop_vs_padded": med["padded"] / med["loop"], "backend_takes": chosen,
                   "backend_takes_cheaper": med[chosen] == min(med.values())}
            results.append(row)
            print(f"{spec} ({row['queries']} queries): " + ", ".join(
                f"{n} {med[n]:.0f} us ({min(v):.0f}-{max(v):.0f})" for n, v in us.items())
                + f"; loop {row['loop_vs_padded']:.2f}x cheaper; backend takes {chosen}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"head_dim": args.head_dim, "rounds": args.rounds, "calls": args.calls,
                       "torch": torch.__version__, "results": results}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
