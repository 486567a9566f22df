"""The document mask: block-diagonal causal, and eager and sdpa apply it alike."""

import torch

from moe.attention.document_mask import document_causal_mask
from moe.attention.eager import eager_attention
from moe.attention.sdpa import SDPAAttention


def test_the_mask_is_block_diagonal_causal():
    mask = document_causal_mask(torch.tensor([[0, 0, 1, 1, 1]]))
    expected = torch.tensor([[1, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0],
                             [0, 0, 1, 0, 0],
                             [0, 0, 1, 1, 0],
                             [0, 0, 1, 1, 1]], dtype=torch.bool)
    assert mask.shape == (1, 1, 5, 5) and torch.equal(mask[0, 0], expected)


def test_eager_and_sdpa_give_each_document_its_own_causal_attention():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    mask = document_causal_mask(torch.tensor([[0, 0, 0, 1, 1, 1]]))
    eager = eager_attention(q, k, v, attn_mask=mask)
    sdpa = SDPAAttention()(q, k, v, attn_mask=mask)
    torch.testing.assert_close(eager, sdpa, rtol=1e-5, atol=1e-5)
    # the second document alone, from its own start, is what the packed row computed
    alone = eager_attention(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:])
    torch.testing.assert_close(eager[:, :, 3:], alone, rtol=1e-5, atol=1e-5)
