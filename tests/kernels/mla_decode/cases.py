"""Shared inputs of the MLA decode tests: a latent cache, random non-contiguous block tables and
absorbed queries (tests/kernels/paged_attention/cases.py picks the device and the interpreter)."""

import torch

from tests.kernels.paged_attention.cases import DEVICE, make_tables, needs_triton  # noqa: F401  (re-exported)


def mla_case(rank, rope, heads, lens, block_size, dtype, seed=0, spare_blocks=4):
    """(q_latent, q_rope, cache, tables, context_lens, scale) with every row of the cache random, so
    rows past a context are garbage a correct kernel never reads."""
    g = torch.Generator().manual_seed(seed)
    nb = sum(-(-c // block_size) for c in lens) + spare_blocks
    cache = torch.randn(nb, block_size, 1, rank + rope, generator=g).to(dtype).to(DEVICE)
    tables = make_tables(lens, block_size, nb, seed=seed).to(DEVICE)
    q_lat = torch.randn(len(lens), heads, rank, generator=g).to(dtype).to(DEVICE)
    q_rope = torch.randn(len(lens), heads, rope, generator=g).to(dtype).to(DEVICE)
    ctx = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    return q_lat, q_rope, cache, tables, ctx, (128 + rope) ** -0.5
