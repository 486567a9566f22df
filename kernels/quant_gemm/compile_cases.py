"""The quantized GEMM launches `python -m kernels.compile_check --parts quant` compiles (on CPU
tensors, for a GPU it does not have): for each case, the dense projection with a bias and the expert
gather-GEMM as the quantized experts launch it (gate/up gathered by token; down grouped in and
scattered with the router weight). Cases: the weight-only formats `int8`, `int4` (groups of 128),
`fp8` (E4M3 decoded in the kernel), and `w8a8` (E4M3 activations x E4M3 weights on FP8 tensor
cores; sm_89+ only, so the caller leaves it out below that)."""

from __future__ import annotations

from typing import Callable

import torch

from kernels.moe_gemm import CUDA_BLOCK_M, moe_routing
from kernels.quant_gemm.checks import FORMATS, QuantWeight
from kernels.quant_gemm import launch
from kernels.quant_gemm.launch import quant_grouped_gemm, quant_linear

QUANT_CASES = (*FORMATS, "w8a8")
PART = "quant"  # the name `--parts` selects these cases by
LAUNCH_MODULES = (launch,)  # whose `check_launch` (tensors on CUDA) compile_check lifts


def _weight(fmt: str, lead: tuple, out_f: int, in_f: int, group_size: int = 128) -> QuantWeight:
    """A stored weight of `fmt` in `moe.quant`'s layout (zeros: only the launch arguments matter)."""
    n_groups, u8 = -(-in_f // group_size), torch.uint8
    if fmt == "int4":
        return QuantWeight(fmt, torch.zeros(*lead, out_f, n_groups * group_size // 2, dtype=u8),
                           torch.ones(*lead, out_f, n_groups), torch.zeros(*lead, out_f, n_groups, dtype=u8),
                           in_f, group_size)
    q = torch.zeros(*lead, out_f, in_f, dtype=torch.int8 if fmt == "int8" else u8)
    return QuantWeight(fmt, q, torch.ones(*lead, out_f, 1), None, in_f)


def quant_launches(dtype: torch.dtype, cases=QUANT_CASES, d_model: int = 256, hidden: int = 192, n_experts: int = 4,
                   top_k: int = 2) -> None:
    T = 40
    experts = torch.randint(0, n_experts, (T, top_k), generator=torch.Generator().manual_seed(0))
    routing = moe_routing(experts, n_experts, block_m=CUDA_BLOCK_M)
    w_sorted = torch.ones(routing.n_assign)
    for case in cases:
        w8a8 = case == "w8a8"
        fmt, act = ("fp8", torch.float8_e4m3fn) if w8a8 else (case, dtype)
        x = torch.zeros(T, d_model, dtype=act)
        h = torch.zeros(routing.n_assign, hidden, dtype=act)
        xs, hs = (torch.ones(T), torch.ones(routing.n_assign)) if w8a8 else (None, None)
        quant_linear(x, _weight(fmt, (), 3 * d_model, d_model), torch.zeros(3 * d_model), x_scale=xs,
                     out_dtype=dtype)
        quant_grouped_gemm(x, _weight(fmt, (n_experts,), 2 * hidden, d_model), routing, x_grouped=False,
                           y_grouped=True, x_scale=xs, out_dtype=dtype)
        quant_grouped_gemm(h, _weight(fmt, (n_experts,), d_model, hidden), routing, x_grouped=True, y_grouped=False,
                           scale=w_sorted, x_scale=hs, out_dtype=dtype)


def launches(dtype_name: str, dtype: torch.dtype, arch: int, options: dict) -> list[tuple[str, Callable[[], None]]]:
    """`options["quant_formats"]` (`--quant-formats`, default every case); w8a8's FP8 dots need sm_89+."""
    fmts = options.get("quant_formats") or list(QUANT_CASES)
    if set(fmts) - set(QUANT_CASES):
        raise ValueError(f"--quant-formats: allowed {list(QUANT_CASES)}; got {','.join(fmts)}")
    fmts = [f for f in fmts if f != "w8a8" or arch >= 89]
    return [(f"quant_gemm {'/'.join(fmts)} {dtype_name}", lambda: quant_launches(dtype, fmts))]
