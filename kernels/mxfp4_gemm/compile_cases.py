"""The MXFP4 GEMM launches `python -m kernels.compile_check --parts mxfp4` compiles (on CPU tensors, for
a GPU it does not have): the dense projection with a bias, and the expert gather-GEMM as the
quantized experts launch it (gate/up gathered by token; down grouped in and scattered with the
router weight). The input dims are not multiples of the tiles' BLOCK_K (a short last block)."""

from __future__ import annotations

from typing import Callable

import torch

from kernels.moe_gemm import CUDA_BLOCK_M, moe_routing
from kernels.mxfp4_gemm import launch
from kernels.mxfp4_gemm.checks import BLOCK, MXWeight
from kernels.mxfp4_gemm.launch import mxfp4_grouped_gemm, mxfp4_linear

PART = "mxfp4"  # the name `--parts` selects these cases by
LAUNCH_MODULES = (launch,)  # whose `check_launch` (tensors on CUDA) compile_check lifts


def _weight(lead: tuple, out_f: int, in_f: int) -> MXWeight:
    groups = -(-in_f // BLOCK)
    return MXWeight(torch.zeros(*lead, out_f, groups, BLOCK // 2, dtype=torch.uint8),
                    torch.full((*lead, out_f, groups), 127, dtype=torch.uint8), in_f)


def mxfp4_launches(dtype: torch.dtype, d_model: int = 288, hidden: int = 160, n_experts: int = 4, top_k: int = 2):
    T = 40
    experts = torch.randint(0, n_experts, (T, top_k), generator=torch.Generator().manual_seed(0))
    routing = moe_routing(experts, n_experts, block_m=CUDA_BLOCK_M)
    x = torch.zeros(T, d_model, dtype=dtype)
    h = torch.zeros(routing.n_assign, hidden, dtype=dtype)
    mxfp4_linear(x, _weight((), 3 * d_model, d_model), torch.zeros(3 * d_model))
    mxfp4_grouped_gemm(x, _weight((n_experts,), 2 * hidden, d_model), routing, x_grouped=False, y_grouped=True)
    mxfp4_grouped_gemm(h, _weight((n_experts,), d_model, hidden), routing, x_grouped=True, y_grouped=False,
                       scale=torch.ones(routing.n_assign))


def launches(dtype_name: str, dtype: torch.dtype, arch: int, options: dict) -> list[tuple[str, Callable[[], None]]]:
    return [(f"mxfp4_gemm {dtype_name}", lambda: mxfp4_launches(dtype))]
