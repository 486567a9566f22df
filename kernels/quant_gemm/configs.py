"""Tile sizes of the quantized GEMM kernels: the one small config the interpreter uses and the
autotune tables on CUDA. Weight-only kernels are bound by reading the weight at small batch (decode)
and by the dot at large batch, so the dense table spans a 16-row tile (one decode step of a few
sequences) to 128-row tiles; the gather kernel's BLOCK_M is the routing's (kernels.moe_gemm)."""

from __future__ import annotations

INTERPRET_LINEAR = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)
INTERPRET_GATHER = dict(BLOCK_N=32, BLOCK_K=32)

LINEAR_TILES = ["BLOCK_M", "BLOCK_N", "BLOCK_K"]
GATHER_TILES = ["BLOCK_N", "BLOCK_K"]
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
LINEAR_ROWS = [(16, 64, 128, 4, 4), (32, 128, 64, 4, 4), (64, 128, 64, 4, 3), (128, 128, 64, 8, 3)]
# (BLOCK_N, BLOCK_K, warps, stages) with the routing's BLOCK_M (128 on CUDA)
GATHER_ROWS = [(64, 64, 4, 4), (128, 64, 8, 3), (128, 32, 4, 4)]
# Exact-fp32 dots (fp32 activations without TF32) run on FMAs with every operand in registers: the
# 16-bit tables above spill 3-15 KB per thread there (`kernels.compile_check`, sm_90), so fp32 gets
# narrow tiles of its own. fp32 is the exact path, not the fast one; serve in bf16 for speed.
LINEAR_FP32_ROWS = [(16, 32, 32, 4, 2), (32, 32, 32, 4, 2), (64, 32, 16, 4, 2)]
GATHER_FP32_ROWS = [(32, 16, 4, 2), (16, 32, 4, 2)]
