"""Paged decode over MLA's latent cache (moe/attention/mla_paged.py): the absorbed form on each
paged backend (torch; Triton under TRITON_INTERPRET=1 without a GPU) equals the expanded torch
reference, on odd shapes (latent 13 + rope 6, 5 heads, block size 3, ragged contexts)."""

import os

import pytest
import torch

from moe.attention import PAGED_BACKENDS
from moe.attention.mla_paged import absorbed_paged_decode, expanded_paged_decode, per_token_fp8_qdq

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

H, NOPE, ROPE, V, C, BS = 5, 7, 6, 9, 13, 3


def case(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    context_lens = torch.tensor([1, 8, 5, 11], dtype=torch.int32)
    num_blocks, width = 20, -(-int(context_lens.max()) // BS)
    cache = torch.randn(num_blocks, BS, 1, C + ROPE, generator=g).to(dtype)
    tables = torch.randperm(num_blocks, generator=g)[:4 * width].view(4, width).to(torch.int32)
    q_nope, q_rope = torch.randn(4, H, NOPE, generator=g).to(dtype), torch.randn(4, H, ROPE, generator=g).to(dtype)
    w_uk, w_uv = torch.randn(H, NOPE, C, generator=g).to(dtype) * 0.5, torch.randn(H, V, C, generator=g).to(dtype)
    return q_nope, q_rope, cache, tables, context_lens, w_uk, w_uv, (NOPE + ROPE) ** -0.5


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_absorbed_decode_equals_the_expanded_reference(backend):
    be = PAGED_BACKENDS.get(backend)()
    args = case()
    expected = expanded_paged_decode(*args)
    got = absorbed_paged_decode(be.decode, *args)
    assert got.shape == (4, H, V)
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4), (got - expected).abs().max()


def test_the_reference_sees_only_each_sequences_context():
    """A row past a sequence's context (garbage in its last block) changes nothing; one inside does."""
    q_nope, q_rope, cache, tables, lens, w_uk, w_uv, scale = case(seed=1)
    before = expanded_paged_decode(q_nope, q_rope, cache, tables, lens, w_uk, w_uv, scale)
    past, inside = cache.clone(), cache.clone()
    past[tables[1, 8 // BS], 8 % BS] = 1e3  # sequence 1: context 8 -> slot 8 is the first one past it
    inside[tables[1, 0], 0] = 1e3
    assert torch.equal(expanded_paged_decode(q_nope, q_rope, past, tables, lens, w_uk, w_uv, scale)[1], before[1])
    assert not torch.allclose(expanded_paged_decode(q_nope, q_rope, inside, tables, lens, w_uk, w_uv, scale)[1],
                              before[1])


def test_the_fp8_activation_rounding_is_the_quant_schemes():
    from moe.quant.schemes.base import quantize_activation

    x = torch.randn(7, 13, generator=torch.Generator().manual_seed(2)) * torch.logspace(-3, 3, 7)[:, None]
    assert torch.equal(per_token_fp8_qdq(x), quantize_activation(x))
    assert not torch.equal(per_token_fp8_qdq(x), x)
