"""`triton` dispatch: the expert MLP as Triton grouped GEMMs (`kernels/moe_gemm/`, ScatterMoE-style:
tokens are gathered by index inside the kernels, never permuted or padded in memory; SwiGLU fused
into the first GEMM; the router weight applied in the second; a full backward through the same
kernels). The autograd Function over the kernels is `triton_mlp.py`.

Runs on CUDA. On CPU it runs only under `TRITON_INTERPRET=1` (slow; tests); otherwise the first
call raises a RuntimeError naming the fix, and `unavailable_reason()` (asked by the registry when the
model is built) makes the build fail with an UnavailableError. Under autocast the operands are cast to the
autocast dtype, as `sorted` does; the output keeps the residual stream's dtype.
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels.moe_gemm import runnable_reason
from moe.experts.base import EXPERT_DISPATCH
from moe.experts.triton_mlp import moe_mlp
from moe.profiling import stage


@EXPERT_DISPATCH.register("triton")
def triton_dispatch(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH) -> torch.Tensor:
    reason = runnable_reason(x_TD.device)
    if reason is not None:
        raise RuntimeError(f"experts.name='triton': {reason}")
    dev = x_TD.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x_TD.dtype
    # The kernels gather and scatter the rows themselves: the whole call counts as expert_gemm.
    with torch.autocast(dev, enabled=False), stage("expert_gemm"):
        y = moe_mlp(x_TD.to(dtype), experts_TK, weights_TK, gate_up_E2HD.to(dtype), down_EDH.to(dtype))
    return y.to(x_TD.dtype)


def unavailable_reason() -> Optional[str]:
    """None when the `triton` dispatch can run on this machine (CUDA, or TRITON_INTERPRET=1), else why."""
    reason = runnable_reason()
    return None if reason is None else f"experts.name='triton': {reason}"


triton_dispatch.unavailable_reason = unavailable_reason
