"""Tile sizes of the MoE kernels: the one small config the interpreter uses, the CUDA row block,
and the autotune tables (tile sizes, warps, stages) the GEMM launchers tune over on CUDA."""

from __future__ import annotations

from kernels.runtime import triton_configs  # noqa: F401  (re-exported: the tables' users build configs here)

# Under the interpreter: one small config (the interpreter is slow per program and per op, so few,
# mid-sized tiles are fastest). On CUDA: BLOCK_M from the routing, the rest autotuned.
INTERPRET_BLOCK_M = 64
INTERPRET_GEMM = dict(BLOCK_N=64, BLOCK_K=64)
INTERPRET_WGRAD = dict(BLOCK_I=64, BLOCK_J=64, BLOCK_K=64)
CUDA_BLOCK_M = 128

GEMM_TILES = ["BLOCK_N", "BLOCK_K"]  # the meta-parameters each table row sets, in its order
WGRAD_TILES = ["BLOCK_I", "BLOCK_J", "BLOCK_K"]

# (BLOCK_N, BLOCK_K, warps, stages) with BLOCK_M = 128 rows; ScatterMoE/Triton-tutorial-like tiles.
GEMM_ROWS = [(128, 32, 4, 4), (128, 64, 8, 3), (64, 64, 4, 4), (256, 32, 8, 3), (64, 32, 4, 5), (128, 128, 8, 3)]
# The fused SwiGLU kernels keep several [BLOCK_M, BLOCK_N] fp32 tiles live (two accumulators in the
# forward; g, gate, up, silu, ... in the backward's epilogue), so their tiles give each thread fewer
# elements: at most 128 x 64 over 8 warps (32 per thread and tile), or 128 x 128 over 16 warps in the
# forward. `python -m kernels.compile_check` (registers and spills from the sm_90 cubins) chose
# these: none spills, where 128 x 64 on 4 warps and 128 x 128 on 8 warps spilled up to 1.4 KB per
# thread in the backward, and 16 warps (128 registers each) spilled 832 B.
SWIGLU_ROWS = [(64, 32, 8, 3), (64, 64, 8, 3), (32, 64, 4, 4), (32, 128, 4, 3), (128, 32, 16, 3), (128, 64, 16, 3)]
SWIGLU_BWD_ROWS = [(64, 32, 8, 3), (64, 64, 8, 3), (64, 32, 8, 4), (64, 128, 8, 3), (32, 64, 4, 4)]
# (BLOCK_I, BLOCK_J, BLOCK_K, warps, stages)
WGRAD_ROWS = [(128, 128, 32, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 64, 4, 4),
              (128, 128, 64, 8, 3)]
# The narrowest column tile the SwiGLU backward can run with: it sizes the buffer of per-tile
# router-weight partial sums (one column per tile), so wider tiles leave columns unused, never short.
MIN_SWIGLU_BLOCK_N = min(min(r[0] for r in SWIGLU_BWD_ROWS), INTERPRET_GEMM["BLOCK_N"])

