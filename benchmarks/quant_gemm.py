"""Speed of the Triton weight-only quantized GEMMs (kernels/quant_gemm) against peers in the same run.

    python -m benchmarks.quant_gemm [--json quant_gemm.json]             # CUDA, bf16
    TRITON_INTERPRET=1 python -m benchmarks.quant_gemm --device cpu --smoke  # exercises the code paths only

For each stored format (int8; int4 with groups of 128; fp8 E4M3 weights) and shape, three ways of
computing the same projection are timed (median of CUDA-event timings):

* `kernel`:  the Triton GEMM reading the stored weight and dequantising tile by tile (`w8a8`, the
             fp8 scheme on sm_89+: the per-token E4M3 quantization of x in PyTorch, then an FP8 x FP8
             tensor-core GEMM; both are timed);
* `deq+mm`:  what the quantized modules do without the kernels: dequantise the whole weight to bf16
             (`Scheme.dequantize`; `w8a8`: and quantize-dequantise x per token), then `F.linear` (or,
             for experts, the bf16 Triton grouped GEMM);
* `bf16`:    the full-precision weight through `F.linear` / the bf16 grouped GEMM, no quantization.

Dense projections: `x [M, I] @ W[O, I]^T` for M from one decode row to a prefill. Experts: the
gate/up gather-GEMM `x[token] @ gate_up[e]^T` of T tokens routed top-2 over 8 experts (weight-only
formats; the W8A8 experts path is not timed here). Weights are
rotated over enough copies that the set read exceeds the L2 cache twice, so M = 1 measures DRAM.
Every kernel output is first compared with dequantise-then-matmul in fp32 math on the same bf16
operands (relative Frobenius error below `--max-rel-err`; a correct kernel is off by its bf16 output
rounding, ~2e-3); a wrong output makes the script exit with status 1. On CPU the timings mean nothing.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.timing import finish_record, median_seconds  # noqa: E402
from kernels import moe_gemm  # noqa: E402  (after the path line: the file also runs as a script)
from kernels.quant_gemm import quant_grouped_gemm, quant_linear  # noqa: E402
from moe.quant import get_scheme, quantize_activation  # noqa: E402
from moe.quant.dispatch import fp8_tensor_cores, quant_weight  # noqa: E402
from moe.quant.schemes import quantize_activation_fp8  # noqa: E402

# case -> the scheme storing its weights; w8a8: the fp8 scheme's per-token E4M3 activations on FP8 tensor cores
SCHEMES = {"int8": "int8", "int4": "int4", "fp8": "fp8_weight", "w8a8": "fp8"}
L2_BYTES = 64 << 20  # at least the H100/H200 L2 (50 MiB); the rotated weights total twice this


def bench(fn, device: torch.device, warmup=3, iters=30) -> float:
    """Median seconds per call (CUDA events on a GPU, wall clock elsewhere)."""
    return median_seconds(fn, device, warmup, iters)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm().clamp(min=1e-30))


class Rotation:
    """`n` items used in turn (each call to `next()` gives the following one)."""

    def __init__(self, items):
        self.items, self.i = items, 0

    def next(self):
        self.i = (self.i + 1) % len(self.items)
        return self.items[self.i]


def _copies(nbytes: int, smoke: bool) -> int:
    return 1 if smoke else max(1, min(16, math.ceil(2 * L2_BYTES / max(nbytes, 1))))


def dense_case(fmt: str, M: int, O: int, I: int, dev, dtype, args) -> dict:
    scheme = get_scheme(SCHEMES[fmt], 128)
    w = torch.randn(O, I, device=dev) * 0.02
    stored = scheme.quantize(w)
    qw = quant_weight(scheme, stored, I)
    x = torch.randn(M, I, device=dev, dtype=dtype)
    if fmt == "w8a8":
        def kernel(w):
            xq, xs = quantize_activation_fp8(x)
            return quant_linear(xq, w, x_scale=xs, out_dtype=dtype)

        def deq_mm(w):
            return F.linear(quantize_activation(x), scheme.dequantize(stored_of(w), I, dtype))
        xq, xs = quantize_activation_fp8(x)
        ref = F.linear(xq.float() * xs[:, None], scheme.dequantize(stored, I, torch.float32))  # exact operands
    else:
        def kernel(w):
            return quant_linear(x, w)

        def deq_mm(w):
            return F.linear(x, scheme.dequantize(stored_of(w), I, dtype))
        ref = F.linear(x.float(), scheme.dequantize(stored, I, dtype).float())  # fp32 math on the same operands
    err = rel_err(kernel(qw), ref)
    qbytes = sum(t.numel() * t.element_size() for t in stored.values())
    n = _copies(qbytes, args.smoke)
    qws = Rotation([qw] + [quant_weight(scheme, {k: v.clone() for k, v in stored.items()}, I) for _ in range(n - 1)])
    ws = Rotation([w.to(dtype)] + [w.to(dtype).clone() for _ in range(_copies(O * I * 2, args.smoke) - 1)])
    t_k = bench(lambda: kernel(qws.next()), dev, iters=args.iters)
    t_d = bench(lambda: deq_mm(qws.next()), dev, iters=args.iters)
    t_b = bench(lambda: F.linear(x, ws.next()), dev, iters=args.iters)
    return dict(kind="dense", fmt=fmt, M=M, O=O, I=I, rel_err=err, weight_bytes=qbytes, kernel_us=t_k * 1e6,
                deq_mm_us=t_d * 1e6, bf16_us=t_b * 1e6, weight_gbps=qbytes / t_k / 1e9)


def stored_of(qw) -> dict:
    out = {"qweight": qw.qweight, "scale": qw.scale}
    if qw.zero is not None:
        out["zero"] = qw.zero
    return out


def expert_case(fmt: str, T: int, E: int, K: int, D: int, H: int, dev, dtype, args) -> dict:
    scheme = get_scheme(SCHEMES[fmt], 128)
    w = torch.randn(E, 2 * H, D, device=dev) * 0.02
    stored = scheme.quantize(w)
    qw = quant_weight(scheme, stored, D)
    x = torch.randn(T, D, device=dev, dtype=dtype)
    experts = torch.rand(T, E, device=dev).topk(K, dim=-1).indices
    routing = moe_gemm.moe_routing(experts, E)
    y = quant_grouped_gemm(x, qw, routing)
    deq = scheme.dequantize(stored, D, dtype)
    ref = moe_gemm.grouped_gemm_reference(x, deq, routing, x_grouped=False, y_grouped=True)
    err = rel_err(y, ref)
    wb = w.to(dtype)
    t_k = bench(lambda: quant_grouped_gemm(x, qw, routing), dev, iters=args.iters)
    t_d = bench(lambda: moe_gemm.grouped_gemm(x, scheme.dequantize(stored, D, dtype), routing, x_grouped=False,
                                              y_grouped=True), dev, iters=args.iters)
    t_b = bench(lambda: moe_gemm.grouped_gemm(x, wb, routing, x_grouped=False, y_grouped=True), dev,
                iters=args.iters)
    qbytes = sum(t.numel() * t.element_size() for t in stored.values())
    return dict(kind="experts", fmt=fmt, T=T, E=E, K=K, D=D, H=H, rel_err=err, weight_bytes=qbytes,
                kernel_us=t_k * 1e6, deq_mm_us=t_d * 1e6, bf16_us=t_b * 1e6)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU under TRITON_INTERPRET=1)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--max-rel-err", type=float, default=1e-2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    if args.smoke:
        args.iters = 2
        dense = [(M, 48, 70) for M in (1, 5)]
        experts = [(9, 4, 2, 40, 24)]
    else:
        dense = [(M, O, I) for O, I in ((4096, 4096), (14336, 4096)) for M in (1, 16, 128, 2048)]
        experts = [(T, 8, 2, 4096, 1792) for T in (16, 256, 4096)]
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"{name}, {args.dtype}; times in microseconds; speed-up = peer time / kernel time", flush=True)
    print(f"{'case':<34} {'rel err':>8} {'kernel':>9} {'deq+mm':>9} {'bf16':>9} {'vs deq+mm':>10} {'vs bf16':>8}")
    rows, bad = [], []
    fmts = [f for f in SCHEMES if f != "w8a8" or fp8_tensor_cores(dev)]
    cases = [("dense", fmt, c) for c in dense for fmt in fmts] + [("experts", fmt, c) for c in experts
                                                                   for fmt in fmts if fmt != "w8a8"]
    for kind, fmt, c in cases:
        row = dense_case(fmt, *c, dev, dtype, args) if kind == "dense" else expert_case(fmt, *c, dev, dtype, args)
        label = (f"dense {fmt} M={c[0]} {c[1]}x{c[2]}" if kind == "dense"
                 else f"experts {fmt} T={c[0]} E={c[1]} 2H={2 * c[4]} D={c[3]}")
        print(f"{label:<34} {row['rel_err']:>8.1e} {row['kernel_us']:>9.1f} {row['deq_mm_us']:>9.1f} "
              f"{row['bf16_us']:>9.1f} {row['deq_mm_us'] / row['kernel_us']:>9.2f}x "
              f"{row['bf16_us'] / row['kernel_us']:>7.2f}x", flush=True)
        if not row["rel_err"] <= args.max_rel_err:
            bad.append(f"{label}: relative error {row['rel_err']:.3g} > {args.max_rel_err}")
        rows.append(row)
    return finish_record(dict(device=name, dtype=args.dtype, rows=rows, wrong=bad), args.json, bad)


if __name__ == "__main__":
    sys.exit(main())
