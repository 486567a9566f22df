"""Triton weight-only MXFP4 GEMMs (OCP microscaling FP4: e2m1 codes, an e8m0 exponent per 32 inputs;
GPT-OSS's expert format): the dense projection (`mxfp4_linear`) and the expert gather-GEMM on
`kernels.moe_gemm`'s routing (`mxfp4_grouped_gemm`), dequantising inside the kernel, fp32 accumulation.

Files: `checks.py` (`MXWeight`, the stored layout, checked), `reference.py` (the e2m1 table, the
dequantiser, dequantise-then-matmul in PyTorch), `triton_kernels.py`, `configs.py`, `launch.py`,
`compile_cases.py` (what `kernels.compile_check --parts mxfp4` compiles).
"""

from kernels.mxfp4_gemm.checks import BLOCK, MXWeight
from kernels.mxfp4_gemm.launch import mxfp4_grouped_gemm, mxfp4_linear, runnable_reason
from kernels.mxfp4_gemm.reference import (E2M1_VALUES, dequantize_mxfp4, dequantize_reference, mxfp4_gather_reference,
                                          mxfp4_linear_reference)

__all__ = ["BLOCK", "E2M1_VALUES", "MXWeight", "dequantize_mxfp4", "dequantize_reference", "mxfp4_gather_reference",
           "mxfp4_grouped_gemm", "mxfp4_linear", "mxfp4_linear_reference", "runnable_reason"]
