"""Tile sizes of the MXFP4 GEMM kernels: the interpreter's one config and the CUDA autotune tables.
BLOCK_K is a multiple of 32 (one e8m0 scale per 32 inputs), which every row here keeps; the shapes
otherwise follow kernels/quant_gemm/configs.py (16-row decode tiles up to 128-row prefill tiles;
narrow tiles for exact-fp32 dots, which run on FMAs with every operand in registers). The 64-row
dense tile and the fp32 gather tiles use more warps than quant_gemm's: the decoded MXFP4 tile needs
more registers, and `kernels.compile_check` (sm_90) showed spills with 4 warps."""

from __future__ import annotations

INTERPRET_LINEAR = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)
INTERPRET_GATHER = dict(BLOCK_N=32, BLOCK_K=32)

LINEAR_TILES = ["BLOCK_M", "BLOCK_N", "BLOCK_K"]
GATHER_TILES = ["BLOCK_N", "BLOCK_K"]
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
LINEAR_ROWS = [(16, 64, 128, 4, 4), (32, 128, 64, 4, 4), (64, 128, 64, 8, 3), (128, 128, 64, 8, 3)]
# (BLOCK_N, BLOCK_K, warps, stages) with the routing's BLOCK_M (128 on CUDA)
GATHER_ROWS = [(64, 64, 4, 4), (128, 64, 8, 3), (128, 32, 4, 4)]
LINEAR_FP32_ROWS = [(16, 32, 32, 4, 2), (32, 32, 32, 4, 2)]
GATHER_FP32_ROWS = [(16, 32, 4, 2), (16, 32, 8, 2)]
