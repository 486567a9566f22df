"""Interleaved A/B, by CPU time, of the small operations of a decode step that issue 32 replaced:
each previous form (kept here, as it was at commit 7ebc0bc) against the code now in the engine, on
the same inputs, at the shapes of `benchmarks/generate.py`'s model (8 query and 4
kv heads of 32, 4,096-token vocabulary, blocks of 16).

    python -m benchmarks.step_ops_ab --json out.json

Pairs (old -> new), per batch size B:
- `finite_check`: `isfinite(logits).all(-1).tolist()` -> `finite_rows` (row sums first), [B, 4096]
- `greedy_argmax`: `logits.argmax(-1)` -> `row_argmax` (`max(-1).indices` on the CPU), [B, 4096]
- `rotary`: with the no-op fp32 casts -> `apply_rotary`, q [1, 8, B, 32]
- `contiguous_views`: the view chain -> `decode_contiguous` (one `as_strided` each), batch 1, context 100
- `gathered_plan`: `decode_gathered` making its mask and index in the call (as every layer did) ->
  with the step's `DecodePlan` made once (the cost of making it is then a step's, not a layer's;
  `plan_once_us` reports it), contexts 60-100

Every pair's outputs are compared first (bit for bit); a difference exits 1. Each round times
`--calls` calls of each side in turn with `time.process_time` (another process's CPU time does
not count; its cache and memory contention does). Reported: median, min and max over `--rounds`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import moe.attention.paged_torch_decode as ptd
from moe.attention.paged_torch import decode_contiguous
from moe.engine.sampling.sampler import finite_rows, row_argmax
from moe.model import apply_rotary

G, R, D_HEAD, BS, VOCAB = 4, 2, 32, 16, 4096


def old_rotary(x_BHTd, cos_BTd, sin_BTd):
    cos, sin = cos_BTd.unsqueeze(1), sin_BTd.unsqueeze(1)
    x1, x2 = x_BHTd.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    wide = torch.promote_types(x_BHTd.dtype, torch.float32)
    return (x_BHTd.to(wide) * cos + rotated.to(wide) * sin).to(x_BHTd.dtype)


def old_contiguous(q, k_cache, v_cache, first_slot, context_len, scale):
    _, H, d = q.shape
    k = k_cache.view(-1, G, d)[first_slot:first_slot + context_len].float().transpose(0, 1).unsqueeze(0)
    v = v_cache.view(-1, G, d)[first_slot:first_slot + context_len].float().transpose(0, 1).unsqueeze(0)
    out = F.scaled_dot_product_attention(q.reshape(1, G, H // G, d).float(), k, v, scale=scale)
    return out.reshape(1, H, d).to(q.dtype)


def pairs(B: int, g: torch.Generator) -> dict:
    """name -> (old, new, plan_once) for batch B; each side a no-argument callable returning a tensor or list."""
    out = {}
    logits = torch.randn(B, VOCAB, generator=g) * 4
    out["finite_check"] = (lambda: torch.isfinite(logits).all(dim=-1).tolist(), lambda: finite_rows(logits), None)
    out["greedy_argmax"] = (lambda: logits.argmax(dim=-1), lambda: row_argmax(logits), None)
    q = torch.randn(1, G * R, B, D_HEAD, generator=g)
    cos, sin = torch.randn(1, B, D_HEAD, generator=g), torch.randn(1, B, D_HEAD, generator=g)
    out["rotary"] = (lambda: old_rotary(q, cos, sin), lambda: apply_rotary(q, cos, sin), None)
    n = B * 7 + 8
    kc, vc = torch.randn(n, BS, G, D_HEAD, generator=g), torch.randn(n, BS, G, D_HEAD, generator=g)
    if B == 1:
        q1 = torch.randn(1, G * R, D_HEAD, generator=g)
        out["contiguous_views"] = (lambda: old_contiguous(q1, kc, vc, 32, 100, 0.17),
                                   lambda: decode_contiguous(q1, kc, vc, 32, 100, 0.17), None)
    else:
        bt = torch.randperm(n, generator=g)[:B * 7].view(B, 7).int()
        cl = torch.randint(60, 101, (B,), generator=g, dtype=torch.int32)
        qs = torch.randn(B, G * R, D_HEAD, generator=g)
        ws, plan = ptd.DecodeWorkspace(), ptd.DecodePlan(bt, cl, BS)
        out["gathered_plan"] = (lambda: ptd.decode_gathered(qs, kc, vc, bt, cl, 0.17, ws),
                                lambda: ptd.decode_gathered(qs, kc, vc, bt, cl, 0.17, ws, None, plan),
                                lambda: ptd.DecodePlan(bt, cl, BS).bias(None))
    return out


def same(a, b) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def timed(fn, calls: int) -> float:
    t = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t) / calls * 1e6


def stats(xs: list) -> dict:
    return {"median": round(statistics.median(xs), 2), "min": round(min(xs), 2), "max": round(max(xs), 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    results, bad = [], 0
    with torch.inference_mode():
        for B in args.batches:
            for name, (old, new, once) in pairs(B, g).items():
                if not same(old(), new()):
                    print(f"B={B} {name}: outputs differ", file=sys.stderr)
                    bad += 1
                    continue
                us = {"old": [], "new": []}
                for _ in range(args.rounds):
                    us["old"].append(timed(old, args.calls))
                    us["new"].append(timed(new, args.calls))
                row = {"batch": B, "pair": name, "us_per_call": us, "old": stats(us["old"]), "new": stats(us["new"])}
                if once is not None:
                    row["plan_once_us"] = stats([timed(once, args.calls) for _ in range(args.rounds)])
                results.append(row)
                print(f"B={B:3d} {name:17s} old {row['old']['median']:8.1f} us  new {row['new']['median']:8.1f} us"
                      + (f"  (plan once a step {row['plan_once_us']['median']:.1f} us)" if once else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": args.rounds, "calls": args.calls, "torch": torch.__version__,
                       "threads": torch.get_num_threads(), "results": results}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
