"""The `torch` paged backend's decode attention, before and after issue 32's gathered path, one
layer call at a time, interleaved in one process (so both see the same machine load):

    python -m benchmarks.paged_decode_torch --batches 1 8 64 --json out.json

"before" is `paged_attention_decode_matmul` (the eager backend's decode of gathered blocks until
then: a fresh gather per call, then permuted copies for the batched matmul); "after" is the
backend's `decode` (`decode_gathered`: the gather into reused scratch tensors, then fused SDPA or
one row-contiguous copy and two matmuls). Shapes are the tiny model's (8 query heads, 4 kv heads,
head dim 32, block size 16) with contexts of `--min-ctx`..`--max-ctx` tokens in shuffled blocks
(non-consecutive: what the engine's batch-1 sequences get after the first, too). Each side: median
process CPU time per call over `--repeats` rounds of `--calls` calls (and min-max); outputs are
checked against the reference kernel (exit 1 if they differ).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from kernels.paged_attention import paged_attention_decode_torch
from moe import cli
from moe.attention.paged_torch import TorchPagedAttention, paged_attention_decode_matmul


def case(S: int, args, g: torch.Generator):
    bs, G, d = args.block_size, args.kv_heads, args.head_dim
    ctx_S = torch.randint(args.min_ctx, args.max_ctx + 1, (S,), generator=g)
    W = int((ctx_S + bs - 1).div(bs, rounding_mode="floor").max())
    nb = S * W + 64  # spare blocks, as an engine's cache has
    k, v = torch.randn(nb, bs, G, d, generator=g), torch.randn(nb, bs, G, d, generator=g)
    tables = torch.randperm(nb, generator=g)[:S * W].view(S, W).to(torch.int32)
    q = torch.randn(S, G * args.group, d, generator=g)
    return q, k, v, tables, ctx_S.to(torch.int32)


def cpu_us_per_call(fn, calls: int) -> float:
    t = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t) / calls * 1e6


@cli.guarded
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--min-ctx", type=int, default=60)
    ap.add_argument("--max-ctx", type=int, default=150)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--group", type=int, default=2, help="query heads per kv head")
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    backend, res, bad = TorchPagedAttention(), {}, 0
    for S in args.batches:
        q, k, v, bt, cl = case(S, args, g)
        sides = {"before": lambda: paged_attention_decode_matmul(q, k, v, bt, cl, 0.17),
                 "after": lambda: backend.decode(q, k, v, bt, cl, 0.17)}
        ref = paged_attention_decode_torch(q, k, v, bt, cl, 0.17)
        for name, fn in sides.items():
            if not torch.allclose(fn(), ref, atol=2e-5, rtol=1e-4):
                print(f"FAILED: batch {S}, {name} differs from the reference", file=sys.stderr)
                bad += 1
        times = {name: [] for name in sides}
        with torch.inference_mode():
            for _ in range(args.repeats):  # interleaved: before, after, before, after, ...
                for name, fn in sides.items():
                    fn()  # (warm: the after side's scratch tensors exist from the first call on)
                    times[name].append(cpu_us_per_call(fn, args.calls))
        res[S] = {name: {"median_us": statistics.median(t), "min_us": min(t), "max_us": max(t), "runs_us": t}
                  for name, t in times.items()}
        res[S]["before_over_after"] = res[S]["before"]["median_us"] / res[S]["after"]["median_us"]
        print(f"batch {S}: before {res[S]['before']['median_us']:.0f} us, after {res[S]['after']['median_us']:.0f} us "
              f"per layer call (CPU, median of {args.repeats}) -> {res[S]['before_over_after']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "batches": res}, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
