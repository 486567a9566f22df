"""The Triton launcher of MLA's absorbed paged decode: input checks, grid, tiles and split count
around `triton_kernels.py`'s kernel; `reference.py`'s `mla_decode_torch` defines its semantics."""

from __future__ import annotations

from typing import Optional

import torch

from kernels import runtime
from kernels.mla_decode.checks import check_mla_decode
from kernels.mla_decode import triton_kernels as tk
from kernels.paged_attention.launch import default_num_splits, reduce_splits, split_buffers
from kernels.runtime import check_launch, dot_flags, interpreting, pow2

KERNELS = "the Triton MLA decode kernel"
_LOG2E = 1.4426950408889634
BLOCK_H = 16  # heads per program: tl.dot's smallest row tile (MLA has no GQA groups to share a tile)


def runnable_reason(device: Optional[torch.device] = None) -> Optional[str]:
    """None when the kernel can run on `device` (default: anywhere available), else why not."""
    return runtime.runnable_reason(device, KERNELS)


def tiles(rank: int, rope: int, dtype: torch.dtype) -> dict:
    """The kernel's tile constexprs and launch options for a latent of `rank` + `rope` in `dtype`.
    Shared memory is about num_stages x BLOCK_N x (BLOCK_C + BLOCK_R) x element size (the cache
    tiles) plus the query tiles: at 512 + 64 that is ~76 KB in 16-bit with 32-row tiles and 2
    stages, ~76 KB in fp32 with 16 rows (compile records: docs/results/compile_check/)."""
    block_c, block_r = pow2(rank, 16), pow2(rope, 16)
    wide = torch.empty((), dtype=dtype).element_size() >= 4
    block_n = 16 if interpreting() or wide else 32
    return dict(BLOCK_C=block_c, BLOCK_R=block_r, BLOCK_H=BLOCK_H, BLOCK_N=block_n,
                num_warps=8 if block_c >= 512 else 4, num_stages=2)


def mla_decode(q_latent: torch.Tensor, q_rope: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor,
               context_lens: torch.Tensor, scale: float, num_splits: Optional[int] = None,
               out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """MLA's absorbed paged decode (Triton): `q_latent [T, H, C]` (W_UK^T q_nope), `q_rope [T, H, R]`
    against a latent cache `[num_blocks, block_size, 1, C + R]` -> the latent mix `[T, H, C]` in
    q_latent's dtype. Every context_lens[t] must be >= 1. `num_splits=None`: paged attention's
    `default_num_splits` over (sequences x head tiles), no host sync."""
    check_mla_decode(q_latent, q_rope, cache, block_tables, context_lens)
    check_launch(KERNELS, q_latent, q_rope, cache, block_tables, context_lens)
    T, H, C = q_latent.shape
    R, bs = q_rope.shape[2], cache.shape[1]
    out = torch.empty_like(q_latent) if out is None else out
    if T == 0:
        return out
    head_tiles = -(-H // BLOCK_H)
    if num_splits is None:
        num_splits = default_num_splits(T, head_tiles, block_tables.shape[1] * bs, q_latent.device)
    if num_splits < 1:
        raise ValueError(f"mla_decode: num_splits must be >= 1; got {num_splits}")
    part, lse, part_strides, lse_strides = split_buffers(T, H, C, num_splits, out)
    kv = cache[:, :, 0]  # [num_blocks, block_size, C + R] (a view)
    tk.mla_decode[(T, head_tiles, num_splits)](
        q_latent, q_rope, kv, block_tables, context_lens, out, part, lse,
        float(scale) * _LOG2E, num_splits, H,
        *q_latent.stride(), *q_rope.stride(), *kv.stride(), *block_tables.stride(), *out.stride(),
        *part_strides, *lse_strides,
        RANK=C, ROPE=R, BLOCK_SIZE=bs, SPLIT=num_splits > 1, **tiles(C, R, cache.dtype),
        **dot_flags(cache.dtype, allow_tf32=False))
    reduce_splits(part, lse, out, num_splits)
    return out
