"""The paged-attention launches `python -m kernels.compile_check --parts paged` compiles (on CPU
tensors, for a GPU it does not have): per cache dtype x head dim (`--head-dims`) x GQA group
(`--groups`), the cache write, decode (one split and flash-decoding splits + reduce) and varlen
prefill, each also with a sliding window and attention sinks."""

from __future__ import annotations

from typing import Callable

import torch

from kernels import paged_attention as pa
from kernels.paged_attention import launch

PART = "paged"  # the name `--parts` selects these cases by
LAUNCH_MODULES = (launch,)  # whose `check_launch` (tensors on CUDA) compile_check lifts


def paged_attention_launches(dtype: torch.dtype, head_dim: int, group: int, block_size: int = 16):
    """Cache write, decode (one split and flash-decoding splits + reduce) and varlen prefill."""
    g = torch.Generator().manual_seed(0)
    G = 2
    H, S, nb = G * group, 3, 16
    kc = torch.randn(nb, block_size, G, head_dim, generator=g).to(dtype)
    vc = torch.randn(nb, block_size, G, head_dim, generator=g).to(dtype)
    tables = torch.randperm(nb, generator=g)[: S * 4].view(S, 4).to(torch.int32)
    lens = torch.tensor([1, block_size + 3, 4 * block_size], dtype=torch.int32)
    q = torch.randn(S, H, head_dim, generator=g).to(dtype)
    k_new = torch.randn(5, G, head_dim, generator=g).to(dtype)
    pa.reshape_and_cache(k_new, k_new.clone(), kc, vc, torch.arange(5, dtype=torch.int64))
    pa.paged_attention_decode(q, kc, vc, tables, lens, 0.125, num_splits=1)
    pa.paged_attention_decode(q, kc, vc, tables, lens, 0.125, num_splits=4)
    cu = torch.tensor([0, 1, 4, 4 + 2 * block_size], dtype=torch.int32)
    qp = torch.randn(int(cu[-1]), H, head_dim, generator=g).to(dtype)
    pa.paged_attention_prefill(qp, kc, vc, tables, cu, lens.clamp(min=cu.diff().max().item()), 0.125)
    # a layer with a sliding window and attention sinks (GPT-OSS): the kernels' other constexpr variants
    sinks = torch.randn(H, generator=g)
    pa.paged_attention_decode(q, kc, vc, tables, lens, 0.125, num_splits=4, window=8, sinks_H=sinks)
    pa.paged_attention_prefill(qp, kc, vc, tables, cu, lens.clamp(min=cu.diff().max().item()), 0.125, window=8,
                               sinks_H=sinks)


def launches(dtype_name: str, dtype: torch.dtype, arch: int, options: dict) -> list[tuple[str, Callable[[], None]]]:
    return [(f"paged attention {dtype_name} head_dim={d} gqa_group={grp}",
             lambda d=d, grp=grp: paged_attention_launches(dtype, d, grp))
            for d in options["head_dims"] for grp in options["groups"]]
