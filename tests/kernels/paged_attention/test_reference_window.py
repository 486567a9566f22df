"""The paged references (and the engine's `torch` backend, both of its prefill paths) with a
sliding window and attention sinks equal dense eager attention over each sequence's contiguous
K/V: decode, whole prefill, and the chunks of a prompt longer than the window."""

import math

import pytest
import torch

from kernels.paged_attention import paged_attention_decode_torch, paged_attention_prefill_torch
from moe.attention import PAGED_BACKENDS, eager_attention
from moe.attention.paged_torch import paged_attention_prefill_sdpa
from tests.kernels.paged_attention.cases import TOL, make_cache, make_tables

H, G, D, BS = 4, 2, 8, 4
CONTEXTS = [3, 13, 22]


def _dense(q_rows, k_cache, v_cache, table, ctx, window, sinks):
    blocks = table[:math.ceil(ctx / BS)].long()
    k = k_cache[blocks].reshape(-1, G, D)[:ctx].float()
    v = v_cache[blocks].reshape(-1, G, D)[:ctx].float()
    out = eager_attention(q_rows.float().transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                          True, window, sinks)
    return out[0].transpose(0, 1)


@pytest.fixture
def setup():
    k_cache, v_cache = make_cache(24, BS, G, D, torch.float32)
    tables = make_tables(CONTEXTS, BS, 24)
    return k_cache, v_cache, tables


@pytest.mark.parametrize("window", [None, 1, 5])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_decode(setup, window, with_sinks):
    k_cache, v_cache, tables = setup
    sinks = torch.randn(H) if with_sinks else None
    q = torch.randn(len(CONTEXTS), H, D)
    ctx = torch.tensor(CONTEXTS, dtype=torch.int32)
    out = paged_attention_decode_torch(q, k_cache, v_cache, tables, ctx, 1 / math.sqrt(D), window, sinks)
    for s, c in enumerate(CONTEXTS):
        torch.testing.assert_close(out[s], _dense(q[s:s + 1], k_cache, v_cache, tables[s], c, window, sinks)[0],
                                   **TOL[torch.float32])


@pytest.mark.parametrize("window", [None, 2, 5])
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("prefill", ["reference", "sdpa"])
def test_chunked_prefill_longer_than_the_window(setup, window, with_sinks, prefill):
    """Each sequence's last q_len tokens (a later chunk: q_len < ctx, ctx > window) and a whole
    prompt (q_len == ctx) attend as dense eager attention over the full sequence does."""
    k_cache, v_cache, tables = setup
    sinks = torch.randn(H) if with_sinks else None
    q_lens = [3, 6, 22]  # the last sequence is a whole-prompt prefill
    q = torch.randn(sum(q_lens), H, D)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    ctx = torch.tensor(CONTEXTS, dtype=torch.int32)
    if prefill == "reference":
        out = paged_attention_prefill_torch(q, k_cache, v_cache, tables, cu, ctx, 1 / math.sqrt(D), max(q_lens),
                                            window, sinks)
    else:
        out = paged_attention_prefill_sdpa(q, k_cache, v_cache, tables, cu, ctx, 1 / math.sqrt(D), window, sinks)
    for s, c in enumerate(CONTEXTS):
        rows = slice(int(cu[s]), int(cu[s + 1]))
        torch.testing.assert_close(out[rows], _dense(q[rows], k_cache, v_cache, tables[s], c, window, sinks),
                                   **TOL[torch.float32])


def test_the_torch_backend_passes_window_and_sinks_on(setup):
    k_cache, v_cache, tables = setup
    sinks, q = torch.randn(H), torch.randn(len(CONTEXTS), H, D)
    ctx = torch.tensor(CONTEXTS, dtype=torch.int32)
    backend = PAGED_BACKENDS.get("torch")()
    plain = backend.decode(q, k_cache, v_cache, tables, ctx, 1 / math.sqrt(D))
    windowed = backend.decode(q, k_cache, v_cache, tables, ctx, 1 / math.sqrt(D), 2, sinks)
    torch.testing.assert_close(windowed, paged_attention_decode_torch(q, k_cache, v_cache, tables, ctx,
                                                                      1 / math.sqrt(D), 2, sinks))
    assert not torch.allclose(plain[1:], windowed[1:])
