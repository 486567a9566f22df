"""Shared inputs of the paged-attention tests (tests/kernels/test_paged_attention_*.py and the
paged backends' tests in tests/attention/): caches, random non-contiguous block tables, and plain
dense attention to check the references against."""

import math
import os

import pytest
import torch

if not torch.cuda.is_available():  # before the first kernel launch (kernels compile lazily)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.runtime import interpreting, triton  # noqa: E402
from moe.attention import eager_attention  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
needs_triton = pytest.mark.skipif(triton is None or (DEVICE == "cpu" and not interpreting()),
                                  reason="needs triton, and CUDA or TRITON_INTERPRET=1")
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def make_cache(num_blocks, block_size, G, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_blocks, block_size, G, d, generator=g).to(dtype).to(DEVICE)
    v = torch.randn(num_blocks, block_size, G, d, generator=g).to(dtype).to(DEVICE)
    return k, v


def make_tables(context_lens, block_size, num_blocks, seed=0, share_prefix=True):
    """Random, non-contiguous block tables; sequences 1.. share sequence 0's first block."""
    g = torch.Generator().manual_seed(seed)
    width = max(math.ceil(c / block_size) for c in context_lens)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    rows, used = [], 0
    for i, c in enumerate(context_lens):
        n = math.ceil(c / block_size)
        row = perm[used:used + n]
        used += n
        if share_prefix and i > 0 and n > 1:
            row[0] = rows[0][0]  # a shared prefix block
        rows.append(row + [0] * (width - n))
    assert used <= num_blocks
    return torch.tensor(rows, dtype=torch.int32, device=DEVICE)


def dense_reference(q_rows, k_cache, v_cache, table, ctx, scale):
    """Contiguous K/V of one sequence -> eager causal attention for its last len(q_rows) queries."""
    bs = k_cache.shape[1]
    blocks = table[:math.ceil(ctx / bs)].long()
    k = k_cache[blocks].reshape(-1, *k_cache.shape[2:])[:ctx].float()
    v = v_cache[blocks].reshape(-1, *v_cache.shape[2:])[:ctx].float()
    q = q_rows.float()
    assert scale == 1 / math.sqrt(q.shape[-1])
    out = eager_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], causal=True)
    return out[0].transpose(0, 1)
