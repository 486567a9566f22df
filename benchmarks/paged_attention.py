"""Bandwidth of the Triton paged-attention decode kernel (CUDA only).

    python benchmarks/paged_attention.py                  # bf16, head_dim 128, a grid of shapes
    python benchmarks/paged_attention.py --peak-gbps 4800 --block-size 256

Decode reads every cached K/V byte once, so its speed is memory bandwidth: the figure is
`bytes of K/V (+ q, out) / time`, against the device's peak (a table of known GPUs, or
`--peak-gbps`). flash-attn's `flash_attn_with_kvcache` with a block table is timed on the same
cache when it is installed (it needs block_size % 256 == 0). Each shape is first checked against
the PyTorch reference.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PEAK_GBPS = {"H200": 4800, "H100 SXM": 3350, "H100 PCIe": 2000, "H100": 3350, "A100-SXM4-80GB": 2039,
             "A100 80GB PCIe": 1935, "A100": 1555, "L40S": 864, "RTX 4090": 1008, "A10": 600, "L4": 300}


def peak_gbps(name: str):
    for key, v in PEAK_GBPS.items():
        if key.lower() in name.lower():
            return v
    return None


def bench(fn, warmup=5, iters=50) -> float:
    """Median seconds per call (CUDA events)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    return times[len(times) // 2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--n-heads", type=int, default=32)
    ap.add_argument("--n-kv-heads", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--context", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--num-splits", type=int, default=None, help="default: the launcher's heuristic")
    ap.add_argument("--peak-gbps", type=float, default=None)
    args = ap.parse_args(argv)

    if not torch.cuda.is_available():
        print("benchmarks/paged_attention.py measures GPU memory bandwidth and needs a CUDA device; "
              "none is available here, so there is nothing to measure. (The kernels' correctness is "
              "tested on CPU under TRITON_INTERPRET=1: pytest tests/kernels/test_paged_attention.py)")
        return 0
    from kernels import paged_attention as pa
    if pa.triton is None:
        print("triton is not installed: pip install triton")
        return 1
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    peak = args.peak_gbps or peak_gbps(name)
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        flash_attn_with_kvcache = None
    use_flash = flash_attn_with_kvcache is not None and args.block_size % 256 == 0 and dtype != torch.float32
    print(f"{name}: peak {peak or '?'} GB/s; {args.dtype}, H={args.n_heads}, G={args.n_kv_heads}, "
          f"d={args.head_dim}, block_size={args.block_size}; flash-attn: "
          f"{'yes' if use_flash else 'not installed' if flash_attn_with_kvcache is None else 'needs block_size % 256 == 0'}")
    print(f"{'batch':>6} {'context':>8} {'splits':>6} {'triton us':>10} {'GB/s':>8} {'% peak':>7}"
          + (f" {'flash us':>9} {'GB/s':>8}" if use_flash else ""))
    H, G, d, bs = args.n_heads, args.n_kv_heads, args.head_dim, args.block_size
    scale = 1 / math.sqrt(d)
    for S in args.batch:
        for ctx in args.context:
            blocks_per_seq = math.ceil(ctx / bs)
            nb = S * blocks_per_seq
            k_cache = torch.randn(nb, bs, G, d, device=dev, dtype=dtype)
            v_cache = torch.randn_like(k_cache)
            block_tables = torch.randperm(nb, device=dev, dtype=torch.int64).to(torch.int32).view(S, blocks_per_seq)
            lens = torch.full((S,), ctx, dtype=torch.int32, device=dev)
            q = torch.randn(S, H, d, device=dev, dtype=dtype)
            out = pa.paged_attention_decode(q, k_cache, v_cache, block_tables, lens, scale, args.num_splits)
            if S * ctx <= 128 * 2048:
                ref = pa.paged_attention_decode_torch(q, k_cache, v_cache, block_tables, lens, scale)
                torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
            splits = args.num_splits or pa.default_num_splits(S, G, blocks_per_seq * bs, dev)
            nbytes = 2 * S * ctx * G * d * k_cache.element_size() + 2 * q.numel() * q.element_size()
            t = bench(lambda: pa.paged_attention_decode(q, k_cache, v_cache, block_tables, lens, scale,
                                                        args.num_splits, out=out))
            gbps = nbytes / t / 1e9
            row = f"{S:>6} {ctx:>8} {splits:>6} {t * 1e6:>10.1f} {gbps:>8.0f} {100 * gbps / peak if peak else float('nan'):>6.0f}%"
            if use_flash:
                qf = q.unsqueeze(1)
                tf = bench(lambda: flash_attn_with_kvcache(qf, k_cache, v_cache, cache_seqlens=lens,
                                                           block_table=block_tables, softmax_scale=scale))
                row += f" {tf * 1e6:>9.1f} {nbytes / tf / 1e9:>8.0f}"
            print(row)
            k_cache = v_cache = None  # free before the next shape allocates
    return 0


if __name__ == "__main__":
    sys.exit(main())
