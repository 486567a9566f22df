"""Input checks of the MLA decode (shared by the Triton launcher and the PyTorch reference): one
ValueError naming the argument and what it must be."""

from __future__ import annotations

import torch

from kernels.runtime import FLOAT_DTYPES


def check_mla_decode(q_latent, q_rope, cache, block_tables, context_lens) -> None:
    """q_latent `[T, H, C]`, q_rope `[T, H, R]`, a latent cache `[num_blocks, block_size, 1, C + R]`,
    int32 block tables `[T, max_blocks]` and context lengths `[T]`, all on one device."""
    what = "mla_decode"
    if q_latent.dim() != 3 or q_rope.dim() != 3 or q_rope.shape[:2] != q_latent.shape[:2]:
        raise ValueError(f"{what}: q_latent must be [T, H, kv_lora_rank] and q_rope [T, H, rope_dim] with the same "
                         f"T and H; got {tuple(q_latent.shape)} and {tuple(q_rope.shape)}")
    C, R = q_latent.shape[2], q_rope.shape[2]
    if cache.dim() != 4 or cache.shape[2] != 1 or cache.shape[3] != C + R:
        raise ValueError(f"{what}: cache must be [num_blocks, block_size, 1, kv_lora_rank + rope_dim = {C + R}]; "
                         f"got {tuple(cache.shape)}")
    for name, t in (("q_latent", q_latent), ("q_rope", q_rope), ("cache", cache)):
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{what}: {name} dtype {t.dtype} is not one of {FLOAT_DTYPES}")
    if block_tables.dim() != 2 or block_tables.dtype != torch.int32:
        raise ValueError(f"{what}: block_tables must be a 2-D int32 tensor [T, max_blocks]; "
                         f"got {block_tables.dtype} of shape {tuple(block_tables.shape)}")
    if context_lens.dim() != 1 or context_lens.dtype != torch.int32 or context_lens.shape[0] != q_latent.shape[0] \
            or block_tables.shape[0] != q_latent.shape[0]:
        raise ValueError(f"{what}: context_lens must be a 1-D int32 tensor of T={q_latent.shape[0]} entries and "
                         f"block_tables T rows; got context_lens {context_lens.dtype} {tuple(context_lens.shape)}, "
                         f"block_tables {tuple(block_tables.shape)}")
    for name, t in (("q_rope", q_rope), ("cache", cache), ("block_tables", block_tables),
                    ("context_lens", context_lens)):
        if t.device != q_latent.device:
            raise ValueError(f"{what}: q_latent is on {q_latent.device} but {name} on {t.device}")
