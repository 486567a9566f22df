"""The launches `python -m kernels.compile_check --parts mla` compiles (on CPU tensors, for a GPU it
does not have): the MLA decode kernel at DeepSeek-V2-Lite / V3's latent (kv_lora_rank 512 + rope 64)
with 16 and 128 heads (V2-Lite, V3), one split and split-KV + reduce, and at a small latent
(96 + 32, mla_tiny-like); plus the cache write at width 576, which the engine's `triton` backend
still runs for MLA (its decode is this kernel, its prefill the expanded torch form)."""

from __future__ import annotations

from typing import Callable

import torch

from kernels.mla_decode import launch, mla_decode
from kernels.paged_attention import launch as pa_launch, reshape_and_cache

PART = "mla"
LAUNCH_MODULES = (launch, pa_launch)
SHAPES = ((512, 64), (96, 32))  # (kv_lora_rank, rope)


def mla_decode_launches(dtype: torch.dtype, heads: int, rank: int, rope: int, block_size: int = 16) -> None:
    g = torch.Generator().manual_seed(0)
    S, nb, width = 3, 16, rank + rope
    cache = torch.randn(nb, block_size, 1, width, generator=g).to(dtype)
    tables = torch.randperm(nb, generator=g)[: S * 4].view(S, 4).to(torch.int32)
    lens = torch.tensor([1, block_size + 3, 4 * block_size], dtype=torch.int32)
    q_lat = torch.randn(S, heads, rank, generator=g).to(dtype)
    q_rope = torch.randn(S, heads, rope, generator=g).to(dtype)
    row = torch.randn(5, 1, width, generator=g).to(dtype)
    reshape_and_cache(row, row, cache, cache, torch.arange(5, dtype=torch.int64))
    scale = (128 + rope) ** -0.5
    mla_decode(q_lat, q_rope, cache, tables, lens, scale, num_splits=1)
    mla_decode(q_lat, q_rope, cache, tables, lens, scale, num_splits=4)


def launches(dtype_name: str, dtype: torch.dtype, arch: int, options: dict) -> list[tuple[str, Callable[[], None]]]:
    return [(f"mla decode {dtype_name} heads={h} latent={c}+{r}",
             lambda h=h, c=c, r=r: mla_decode_launches(dtype, h, c, r))
            for c, r in SHAPES for h in ((16, 128) if c == 512 else (16,))]
