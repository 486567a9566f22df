"""Triton weight-only quantized GEMMs: the dense projection (`quant_linear`) and the expert
gather-GEMM on `kernels.moe_gemm`'s routing (`quant_grouped_gemm`), reading int8, packed int4
(per-group scales and zero points) or E4M3 weights as `moe.quant` stores them and dequantising
inside the kernel, fp32 accumulation. W8A8 (`x_scale=`: E4M3 activations with per-row scales
against an fp8 weight) is an FP8 x FP8 tensor-core `tl.dot` instead (sm_89+; the caller falls back
to the decoded-weight GEMM on sm_80).

Files: `checks.py` (`QuantWeight`, the stored layout, checked; activation checks), `reference.py`
(dequantise-then-matmul in PyTorch), `triton_kernels.py`, `configs.py` (tiles, autotune tables),
`launch.py` (the launchers), `compile_cases.py` (what `kernels.compile_check` compiles).
"""

from kernels.quant_gemm.checks import FORMATS, QuantWeight
from kernels.quant_gemm.launch import quant_grouped_gemm, quant_linear, runnable_reason
from kernels.quant_gemm.reference import dequantize_reference, quant_gather_reference, quant_linear_reference

__all__ = ["FORMATS", "QuantWeight", "quant_linear", "quant_grouped_gemm", "runnable_reason",
           "dequantize_reference", "quant_linear_reference", "quant_gather_reference"]
