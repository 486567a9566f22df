"""The MoE grouped-GEMM launches `python -m kernels.compile_check --parts moe` compiles (on CPU
tensors, for a GPU it does not have): the expert MLP forward and backward per dtype."""

from __future__ import annotations

from typing import Callable

import torch

from kernels import moe_gemm
from kernels.moe_gemm import launch

PART = "moe"  # the name `--parts` selects these cases by
LAUNCH_MODULES = (launch,)  # whose `check_launch` (tensors on CUDA) compile_check lifts


def moe_launches(dtype: torch.dtype, d_model: int = 256, hidden: int = 192, n_experts: int = 4, top_k: int = 2):
    """The Triton MoE MLP forward and backward at the CUDA row-block size: every kernel the
    `triton` expert dispatch launches (gate_up_swiglu, scattered grouped_gemm, swiglu_down_backward,
    dx grouped_gemm, two group_weight_grad), each through its autotuner."""
    g = torch.Generator().manual_seed(0)
    T = 40
    x = torch.randn(T, d_model, generator=g).to(dtype)
    gate_up = torch.randn(n_experts, 2 * hidden, d_model, generator=g).to(dtype)
    down = torch.randn(n_experts, d_model, hidden, generator=g).to(dtype)
    experts = torch.randint(0, n_experts, (T, top_k), generator=g)
    weights = torch.rand(T, top_k, generator=g)
    routing = moe_gemm.moe_routing(experts, n_experts, block_m=moe_gemm.CUDA_BLOCK_M)
    w_sorted = moe_gemm.sorted_weights(weights, routing)
    y, gu = moe_gemm.expert_mlp_forward(x, w_sorted, gate_up, down, routing, store_gate_up=True)
    moe_gemm.expert_mlp_backward(torch.ones_like(y), x, gate_up, down, gu, w_sorted, routing, needs=(True,) * 4)


def launches(dtype_name: str, dtype: torch.dtype, arch: int, options: dict) -> list[tuple[str, Callable[[], None]]]:
    return [(f"moe_mlp fwd+bwd {dtype_name}", lambda: moe_launches(dtype))]
