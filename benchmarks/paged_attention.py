"""Bandwidth of the Triton paged-attention decode kernel, against peers in the same run (CUDA).

    python -m benchmarks.paged_attention                      # bf16, head_dim 128, a grid of shapes
    python -m benchmarks.paged_attention --block-size 256 --json pa.json
    TRITON_INTERPRET=1 python -m benchmarks.paged_attention --device cpu --batch 2 --context 40  # smoke run

Decode reads every cached K/V byte once, so its speed is memory bandwidth: the figure is
`bytes of K/V (+ q, out) / time`, reported against
* the device's datasheet peak (a table of known GPUs, or `--peak-gbps`),
* the bandwidth a device-to-device copy reaches in this run (what is achievable in practice),
* peers on the same K/V: flash-attn's `flash_attn_with_kvcache` with a block table when it is
  installed (it needs block_size % 256 == 0), and PyTorch SDPA decode over the same K/V laid out
  contiguously per sequence (`[S, G, ctx, d]`, no paging, `enable_gqa`): what a dense cache gets
  from PyTorch's own kernels.
Each shape is first checked against the PyTorch reference (`paged_attention_decode_torch`). Shapes
whose K/V would fit in the GPU's L2 cache are timed over several copies in rotation (together at
least twice the L2), so that the figure is DRAM bandwidth, not cache bandwidth.
On CPU (with TRITON_INTERPRET=1) the script only exercises its own code paths on tiny shapes;
its timings there mean nothing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from moe import cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.timing import median_seconds  # noqa: E402
from kernels import paged_attention as pa  # noqa: E402  (after the path line: the file also runs as a script)
from kernels.runtime import triton  # noqa: E402

PEAK_GBPS = {"H200": 4800, "H100 SXM": 3350, "H100 PCIe": 2000, "H100": 3350, "A100-SXM4-80GB": 2039,
             "A100 80GB PCIe": 1935, "A100": 1555, "L40S": 864, "RTX 4090": 1008, "A10": 600, "L4": 300}


def peak_gbps(name: str):
    for key, v in PEAK_GBPS.items():
        if key.lower() in name.lower():
            return v
    return None


def bench(fn, device: torch.device, warmup=5, iters=50) -> float:
    """Median seconds per call (CUDA events on a GPU, wall clock elsewhere)."""
    return median_seconds(fn, device, warmup, iters)


def copy_gbps(device: torch.device, nbytes: int) -> float:
    """Achieved device-to-device copy bandwidth (bytes read + written per second)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = bench(lambda: dst.copy_(src), device, warmup=3, iters=20)
    return 2 * nbytes / t / 1e9


def sdpa_dense_decode(q, k_dense, v_dense, scale):
    """q [S, H, d], k/v [S, G, ctx, d] -> [S, H, d] through PyTorch's SDPA (GQA without repeating K/V)."""
    return F.scaled_dot_product_attention(q.unsqueeze(2), k_dense, v_dense, scale=scale, enable_gqa=True).squeeze(2)


@cli.guarded
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--n-heads", type=int, default=32)
    ap.add_argument("--n-kv-heads", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--context", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--num-splits", type=int, default=None, help="default: the launcher's heuristic")
    ap.add_argument("--peak-gbps", type=float, default=None)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--copies", type=int, default=None,
                    help="K/V copies timed in rotation (default: enough to outgrow the L2 cache twice)")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)

    if triton is None:
        print("triton is not installed: pip install triton")
        return 1
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks/paged_attention.py measures GPU memory bandwidth and needs a CUDA device; "
              "none is available here, so there is nothing to measure. (The kernels' correctness is "
              "tested on CPU under TRITON_INTERPRET=1: pytest tests/kernels/test_paged_attention_launch.py; "
              "`--device cpu` with TRITON_INTERPRET=1 smoke-runs this script.)")
        return 0
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (interpreter smoke run)"
    peak = args.peak_gbps or (peak_gbps(name) if dev.type == "cuda" else None)
    copy_bw = copy_gbps(dev, 1 << 30 if dev.type == "cuda" else 1 << 20)
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        flash_attn_with_kvcache = None
    use_flash = (flash_attn_with_kvcache is not None and dev.type == "cuda" and args.block_size % 256 == 0
                 and dtype != torch.float32)
    flash_note = ("yes" if use_flash else "not installed" if flash_attn_with_kvcache is None
                  else "needs block_size % 256 == 0 and a 16-bit cache")
    print(f"{name}: datasheet peak {peak or '?'} GB/s, device copy {copy_bw:,.0f} GB/s; {args.dtype}, "
          f"H={args.n_heads}, G={args.n_kv_heads}, d={args.head_dim}, block_size={args.block_size}; "
          f"flash-attn: {flash_note}", flush=True)
    print(f"{'batch':>6} {'context':>8} {'splits':>6} {'triton us':>10} {'GB/s':>8} {'% peak':>7} {'% copy':>7} "
          f"{'sdpa us':>9} {'vs sdpa':>8}" + (f" {'flash us':>9} {'vs flash':>9}" if use_flash else ""), flush=True)
    H, G, d, bs = args.n_heads, args.n_kv_heads, args.head_dim, args.block_size
    scale = 1 / math.sqrt(d)
    rows = []
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size if dev.type == "cuda" else 0
    for S in args.batch:
        for ctx in args.context:
            blocks_per_seq = math.ceil(ctx / bs)
            nb = S * blocks_per_seq
            kv_bytes = 2 * nb * bs * G * d * torch.empty((), dtype=dtype).element_size()
            copies = args.copies or max(1, min(64, math.ceil(2 * l2 / kv_bytes)))  # rotate: the set outgrows L2
            k_cache = torch.randn(copies * nb, bs, G, d, device=dev, dtype=dtype)
            v_cache = torch.randn_like(k_cache)
            # copy c reads its own blocks c*nb..(c+1)*nb-1, in a random order
            tables = [(c * nb + torch.randperm(nb, device=dev)).to(torch.int32).view(S, blocks_per_seq)
                      for c in range(copies)]
            block_tables = tables[0]
            lens = torch.full((S,), ctx, dtype=torch.int32, device=dev)
            q = torch.randn(S, H, d, device=dev, dtype=dtype)
            out = pa.paged_attention_decode(q, k_cache, v_cache, block_tables, lens, scale, args.num_splits)
            if S * ctx <= 128 * 2048:
                ref = pa.paged_attention_decode_torch(q, k_cache, v_cache, block_tables, lens, scale)
                torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
            splits = args.num_splits or pa.default_num_splits(S, G, blocks_per_seq * bs, dev)
            nbytes = 2 * S * ctx * G * d * k_cache.element_size() + 2 * q.numel() * q.element_size()
            table_turns = itertools.cycle(tables)
            t = bench(lambda: pa.paged_attention_decode(q, k_cache, v_cache, next(table_turns), lens,
                                                        scale, args.num_splits, out=out), dev, iters=args.iters)
            gbps = nbytes / t / 1e9
            # the same K/V, gathered once into a dense per-sequence layout for the SDPA peer
            dense = [(pa.gather_cache(k_cache, bt)[:, :ctx].permute(0, 2, 1, 3).contiguous(),
                      pa.gather_cache(v_cache, bt)[:, :ctx].permute(0, 2, 1, 3).contiguous()) for bt in tables]
            torch.testing.assert_close(sdpa_dense_decode(q, *dense[0], scale).float(), out.float(),
                                       atol=2e-2, rtol=2e-2)
            dense_turns = itertools.cycle(dense)
            ts = bench(lambda: sdpa_dense_decode(q, *next(dense_turns), scale), dev, iters=args.iters)
            dense = dense_turns = None
            row = dict(batch=S, context=ctx, splits=splits, copies=copies, triton_us=t * 1e6, triton_gbps=gbps,
                       pct_peak=100 * gbps / peak if peak else None, pct_copy=100 * gbps / copy_bw,
                       sdpa_us=ts * 1e6, speedup_vs_sdpa=ts / t)
            line = (f"{S:>6} {ctx:>8} {splits:>6} {t * 1e6:>10.1f} {gbps:>8.0f} "
                    f"{row['pct_peak'] if peak else float('nan'):>6.0f}% {row['pct_copy']:>6.0f}% "
                    f"{ts * 1e6:>9.1f} {ts / t:>7.2f}x")
            if use_flash:
                qf = q.unsqueeze(1)
                tf = bench(lambda: flash_attn_with_kvcache(qf, k_cache, v_cache, cache_seqlens=lens,
                                                           block_table=next(table_turns),
                                                           softmax_scale=scale),
                           dev, iters=args.iters)
                row.update(flash_us=tf * 1e6, speedup_vs_flash=tf / t)
                line += f" {tf * 1e6:>9.1f} {tf / t:>8.2f}x"
            print(line, flush=True)
            rows.append(row)
            k_cache = v_cache = None  # free before the next shape allocates
    if args.json:
        Path(args.json).write_text(json.dumps(dict(device=name, dtype=args.dtype, n_heads=H, n_kv_heads=G,
                                                   head_dim=d, block_size=bs, peak_gbps=peak, copy_gbps=copy_bw,
                                                   flash_attn=flash_note, rows=rows), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
