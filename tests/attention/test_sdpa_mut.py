"""`SDPAAttention.__call__` where the attention tests left mutants alive (issue 29, item 6;
docs/results/mutation/run8_attention/): grouped-query heads whose count equals the query length,
the refusal of causal=False with its message, the mask built on the inputs' device, and a document
mask with and without sinks."""

import pytest
import torch
import torch.nn.functional as F

from moe.attention.base import allowed_mask
from moe.attention.document_mask import document_causal_mask
from moe.attention.eager import eager_attention
from moe.attention.sdpa import SDPAAttention

MESSAGE = "sliding windows, sinks and document masks are options of causal attention; got causal=False"


def _qkv(B=2, H=4, G=2, T=8, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, d, generator=g), torch.randn(B, G, T, d, generator=g),
            torch.randn(B, G, T, d, generator=g))


def _segments():
    # two rows packed differently, so the document mask differs between rows and from plain causal
    return document_causal_mask(torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1, 2]]))


@pytest.mark.parametrize("T", [2, 4])
@pytest.mark.parametrize("window, with_sinks", [(None, False), (2, False), (None, True)])
def test_grouped_query_heads_when_a_length_equals_a_head_count(window, with_sinks, T):
    # H=4 query heads on G=2 kv heads: the GQA flag must compare the head counts (dim 1 of q and
    # of k), not a length (dim 2): T=2 is the kv head count, T=4 the query head count
    q, k, v = _qkv(B=1, H=4, G=2, T=T)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0]) if with_sinks else None
    out = SDPAAttention()(q, k, v, True, window, sinks)
    assert out.shape == (1, 4, T, 8)
    torch.testing.assert_close(out, eager_attention(q, k, v, True, window, sinks), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window, with_sinks, with_doc", [(2, False, False), (2, True, False), (None, False, True),
                                                          (None, True, True), (2, True, True)])
def test_the_mask_follows_the_inputs_device_not_the_default_device(window, with_sinks, with_doc):
    # the inputs are on cpu and torch's default device is switched to meta: a mask built on the
    # default device instead of the inputs' lands on meta and cannot meet the cpu scores. The
    # same holds for any pair of devices (a cuda input with a cpu default), so this is no cpu-only check
    q, k, v = _qkv()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0]) if with_sinks else None
    mask = _segments() if with_doc else None
    want = SDPAAttention()(q, k, v, True, window, sinks, mask)
    with torch.device("meta"):
        out = SDPAAttention()(q, k, v, True, window, sinks, mask)
    assert out.device.type == "cpu" and torch.equal(out, want)


@pytest.mark.parametrize("option", ["window", "sinks_H", "attn_mask"])
def test_non_causal_with_a_layer_option_is_refused_with_the_whole_message(option):
    q, k, v = _qkv()
    value = {"window": 2, "sinks_H": torch.zeros(4), "attn_mask": _segments()}[option]
    with pytest.raises(ValueError) as err:
        SDPAAttention()(q, k, v, causal=False, **{option: value})
    # the message names the options and the causal=False that refused them, exactly
    assert str(err.value) == MESSAGE
    assert "document masks" in str(err.value) and "causal=False" in str(err.value)


def test_non_causal_without_options_is_plain_full_attention():
    q, k, v = _qkv()
    torch.testing.assert_close(SDPAAttention()(q, k, v, causal=False), eager_attention(q, k, v, causal=False),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 2])
def test_a_document_mask_with_sinks_equals_eager(window):
    q, k, v = _qkv()
    mask, sinks = _segments(), torch.tensor([0.5, -1.0, 2.0, 0.0])
    out = SDPAAttention()(q, k, v, True, window, sinks, mask)
    ref = eager_attention(q, k, v, True, window, sinks, mask)
    assert torch.equal(out, ref)  # the reference path itself
    # and each option matters in this case, so none of them may be dropped on the way
    for other in (eager_attention(q, k, v, True, window, None, mask), eager_attention(q, k, v, True, window, sinks),
                  eager_attention(q, k, v, True, 3 if window is None else None, sinks, mask)):
        assert not torch.allclose(out, other, atol=1e-3)
    # row 1, second document (positions 5, 6) from its own start, with the same sinks and window
    alone = eager_attention(q[1:, :, 5:7], k[1:, :, 5:7], v[1:, :, 5:7], True, window, sinks)
    torch.testing.assert_close(out[1:, :, 5:7], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 2])
def test_a_document_mask_without_sinks_takes_the_fused_kernel(window):
    # the fused kernel with the document mask (and the window) as its boolean mask, bit for bit;
    # the eager reference agrees to rounding
    q, k, v = _qkv()
    mask = _segments()
    out = SDPAAttention()(q, k, v, True, window, None, mask)
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask & allowed_mask(8, 8, window, q.device),
                                           enable_gqa=True)
    assert torch.equal(out, fused)
    torch.testing.assert_close(out, eager_attention(q, k, v, True, window, None, mask), rtol=1e-5, atol=1e-5)
