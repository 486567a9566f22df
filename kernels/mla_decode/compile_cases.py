"""The launches `python -m kernels.compile_check --parts mla` compiles: the paged kernels at the
latent-cache shapes the engine serves on CUDA (one kv head, the cache passed as K and V, a latent
row of `WIDTH` = 128, the widest the engine lets the Triton backend take, at 16 and 128 heads):
cache write, decode (one split and split-K + reduce) and varlen prefill, per cache dtype.

DeepSeek's own width 576 (kv_lora_rank 512 + rope 64) was compiled with these cases too
(`mla_latent_launches(dtype, heads, width=576)`): the prefill kernel needs 655 KB of shared memory
and the 128-head decode 524 KB, over sm_90's 227 KB (docs/results/mla_decode/compile_check_sm90.txt);
hence the engine's refusal (moe/engine/runner/context.py `TRITON_MAX_LATENT`), and why the default
cases stop at 128: a full `compile_check` run stays clean."""

from __future__ import annotations

from typing import Callable

import torch

from kernels import paged_attention as pa
from kernels.paged_attention import launch

PART = "mla"
LAUNCH_MODULES = (launch,)
WIDTH, ROPE = 128, 32  # latent row = kv_lora_rank + rope (here 96 + 32)


def mla_latent_launches(dtype: torch.dtype, heads: int, width: int = WIDTH, block_size: int = 16) -> None:
    g = torch.Generator().manual_seed(0)
    S, nb = 3, 16
    cache = torch.randn(nb, block_size, 1, width, generator=g).to(dtype)
    tables = torch.randperm(nb, generator=g)[: S * 4].view(S, 4).to(torch.int32)
    lens = torch.tensor([1, block_size + 3, 4 * block_size], dtype=torch.int32)
    q = torch.randn(S, heads, width, generator=g).to(dtype)
    row = torch.randn(5, 1, width, generator=g).to(dtype)
    pa.reshape_and_cache(row, row, cache, cache, torch.arange(5, dtype=torch.int64))
    scale = (128 + ROPE) ** -0.5
    pa.paged_attention_decode(q, cache, cache, tables, lens, scale, num_splits=1)
    pa.paged_attention_decode(q, cache, cache, tables, lens, scale, num_splits=4)
    cu = torch.tensor([0, 1, 4, 4 + 2 * block_size], dtype=torch.int32)
    qp = torch.randn(int(cu[-1]), heads, width, generator=g).to(dtype)
    pa.paged_attention_prefill(qp, cache, cache, tables, cu, lens.clamp(min=cu.diff().max().item()), scale)


def launches(dtype_name: str, dtype: torch.dtype, arch: int, options: dict) -> list[tuple[str, Callable[[], None]]]:
    return [(f"mla latent paged attention {dtype_name} heads={h} width={WIDTH}",
             lambda h=h: mla_latent_launches(dtype, h)) for h in (16, 128)]
