"""Which compute path a quantized module takes: the Triton weight-only kernels
(`kernels.quant_gemm`, the weight dequantised tile by tile inside the GEMM) or dequantise-then-matmul
in PyTorch (`moe/quant/modules.py`, one matmul's weight at a time).

The mode is process-wide (`set_kernel_mode` / the `kernel_mode` context manager):

    auto        (default) kernels on CUDA when Triton is installed, dequantise-then-matmul elsewhere
                (CPU, and under TRITON_INTERPRET=1 unless asked: the interpreter is far too slow to serve)
    kernels     always the kernels; where they cannot run (no CUDA and no TRITON_INTERPRET=1) an
                UnavailableError says why. The tests use it under the interpreter on CPU.
    dequantize  never the kernels

Either way the kernels are forward-only: with autograd recording a graph through the input they
are skipped (the dequantise path is differentiable in the activations). The layout the kernels read
is the scheme's own `kernel_format` (int8 -> int8; int4, awq -> int4: per-group scales and zero points;
fp8_weight, fp8 -> fp8: E4M3 bytes decoded in the kernel; mxfp4 -> `kernels.mxfp4_gemm`, its own
kernels); a scheme without one (a test scheme storing floats) takes the dequantise path. W8A8 `fp8`: where FP8 tensor cores exist (sm_89+; and the interpreter, which computes
E4M3 dots exactly) the activations are quantized per token to E4M3 codes + scales and the GEMM is an
FP8 x FP8 `tl.dot`, both scales applied to the fp32 sums; elsewhere (sm_80) the activations are
quantize-dequantised per token as on CPU and the fp8 weights decoded in the kernel. The two compute
the same products of E4M3 values; the tensor-core path skips rounding the operands to the
activations' dtype, so it is slightly more exact than the dequantise path.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

from kernels.moe_gemm import moe_routing, sorted_weights
from kernels.mxfp4_gemm import MXWeight, mxfp4_grouped_gemm, mxfp4_linear
from kernels.quant_gemm import QuantWeight, quant_grouped_gemm, quant_linear, runnable_reason
from kernels.runtime import interpreting
from moe.errors import ConfigError, UnavailableError
from moe.quant.schemes import Scheme, quantize_activation, quantize_activation_fp8

MODES = ("auto", "kernels", "dequantize")
_mode = "auto"


def set_kernel_mode(mode: str) -> str:
    """Set the process-wide path (`MODES`); returns the previous mode."""
    global _mode
    if mode not in MODES:
        raise ConfigError(f"quant kernel mode={mode!r} is unknown; choose one of {list(MODES)}")
    prev, _mode = _mode, mode
    return prev


@contextlib.contextmanager
def kernel_mode(mode: str) -> Iterator[None]:
    prev = set_kernel_mode(mode)
    try:
        yield
    finally:
        set_kernel_mode(prev)


def use_kernels(scheme: Scheme, x: torch.Tensor) -> bool:
    """Whether a quantized matmul of `scheme` on input `x` runs in the Triton kernels."""
    if _mode == "dequantize" or scheme.kernel_format is None or (torch.is_grad_enabled() and x.requires_grad):
        return False
    reason = runnable_reason(x.device)
    if _mode == "kernels":
        if reason is not None:
            raise UnavailableError(reason)
        return True
    return reason is None and x.is_cuda and not interpreting()


def quant_weight(scheme: Scheme, tensors: dict[str, torch.Tensor], in_features: int) -> QuantWeight | MXWeight:
    """The stored tensors of one weight (`qweight`, `scale`, `zero`; mxfp4: `blocks`, `scales`) as the
    kernels read them."""
    if scheme.kernel_format == "mxfp4":
        return MXWeight(tensors["blocks"].contiguous(), tensors["scales"].contiguous(), in_features)
    grouping = {} if scheme.group_size is None else {"group_size": scheme.group_size}
    return QuantWeight(scheme.kernel_format, tensors["qweight"].contiguous(), tensors["scale"].contiguous(),
                       tensors["zero"].contiguous() if "zero" in tensors else None, in_features, **grouping)


def fp8_tensor_cores(device: torch.device) -> bool:
    """Whether W8A8 runs as an FP8 x FP8 dot on `device` (sm_89+, or the interpreter)."""
    if device.type != "cuda" or interpreting():
        return interpreting()
    return torch.cuda.get_device_capability(device) >= (8, 9)


def _act(x: torch.Tensor, act_fp8: bool, w8a8: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The GEMM's input: x; or its per-token FP8 rounding (as on CPU); or (W8A8) E4M3 codes + scales."""
    if not act_fp8:
        return x.contiguous(), None
    if w8a8:
        q, s = quantize_activation_fp8(x)
        return q.contiguous(), s.contiguous()
    return quantize_activation(x).contiguous(), None


def linear(x: torch.Tensor, w: QuantWeight, bias: Optional[torch.Tensor], act_fp8: bool) -> torch.Tensor:
    """`x @ deq(W)^T + bias` in the kernel (x carries any AWQ input scale; `act_fp8`: W8A8)."""
    if isinstance(w, MXWeight):
        return mxfp4_linear(x.contiguous(), w, None if bias is None else bias.float())
    xk, xs = _act(x, act_fp8, act_fp8 and fp8_tensor_cores(x.device))
    return quant_linear(xk, w, None if bias is None else bias.float(), x_scale=xs, out_dtype=x.dtype)


def _grouped(x: torch.Tensor, w, routing, x_scale: Optional[torch.Tensor], out_dtype: torch.dtype,
             **kw) -> torch.Tensor:
    """The gather-GEMM of `w`'s kernel family (`kernels.mxfp4_gemm` for MXFP4, else `kernels.quant_gemm`)."""
    if isinstance(w, MXWeight):
        return mxfp4_grouped_gemm(x, w, routing, **kw)
    return quant_grouped_gemm(x, w, routing, x_scale=x_scale, out_dtype=out_dtype, **kw)


def experts(x_TD: torch.Tensor, experts_TK: torch.Tensor, weights_TK: torch.Tensor, gate_up, down,
            in_scale_ED: Optional[torch.Tensor], act_fp8: bool, biased=None) -> torch.Tensor:
    """The quantized SwiGLU experts on the gather-GEMM: gate/up rows gathered by token (grouped out),
    SwiGLU in PyTorch, down scattered to assignment rows with the router weight, the K rows summed.
    Dropped assignments (ids outside [0, E)) contribute nothing, as in the loop dispatch. `biased`
    (a `QuantExperts` from GPT-OSS's `BiasedExperts`): its gate/up bias is added to the grouped rows,
    its activation (`act`) replaces SwiGLU, and its down bias, scaled by the router weight as HF
    scales the whole expert output, is added to the assignment rows."""
    T, K = experts_TK.shape
    E = gate_up.n_experts
    routing = moe_routing(experts_TK, E)
    e_sorted = routing.sorted_expert.long().clamp(max=E - 1)  # dropped rows: any expert, their output is 0
    x, x_grouped = x_TD, False
    if in_scale_ED is not None:  # AWQ: each row scaled by its own expert's input scale, so rows are grouped first
        x, x_grouped = x_TD[routing.sorted_token.long()] * in_scale_ED[e_sorted].to(x_TD.dtype), True
    w8a8 = act_fp8 and fp8_tensor_cores(x_TD.device)
    xk, xs = _act(x, act_fp8, w8a8)
    gu = _grouped(xk, gate_up, routing, xs, x_TD.dtype, x_grouped=x_grouped, y_grouped=True)
    if biased is None:
        gate, up = gu.chunk(2, dim=-1)
        h = F.silu(gate) * up
    else:
        bias = biased.gate_up_proj_bias
        h = biased.act(gu if bias is None else gu + bias[e_sorted].to(gu.dtype))
    hk, hs = _act(h.contiguous(), act_fp8, w8a8)
    y = _grouped(hk, down, routing, hs, x_TD.dtype, x_grouped=True, y_grouped=False,
                 scale=sorted_weights(weights_TK, routing))
    if biased is not None and biased.down_proj_bias is not None:
        ids = experts_TK.reshape(-1).long()
        kept = ((ids >= 0) & (ids < E)).unsqueeze(-1)
        w = weights_TK.reshape(-1, 1).float()
        y = y + torch.where(kept, w * biased.down_proj_bias[ids.clamp(0, E - 1)], 0.0).to(y.dtype)
    return y.view(T, K, -1).sum(1)
