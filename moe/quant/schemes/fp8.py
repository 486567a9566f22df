"""fp8: W8A8, fp8_weight's weights AND dynamic per-token E4M3 activations (`quantize_activation`)."""

from __future__ import annotations

from moe.quant.schemes.base import QUANT_SCHEMES
from moe.quant.schemes.fp8_weight import FP8Weight


@QUANT_SCHEMES.register("fp8")
class FP8(FP8Weight):
    """W8A8: FP8 weights and dynamic per-token FP8 activations. On CPU the matmul itself runs in
    the activations' dtype on the dequantised operands (the same products and sums an FP8 tensor
    core computes, up to accumulation order). On CUDA sm_89+ the quantized modules run it as an FP8
    x FP8 tensor-core GEMM instead (kernels/quant_gemm, moe/quant/dispatch.py)."""

    name = "fp8"
    act_fp8 = True
