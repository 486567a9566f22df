"""`eager_attention` and `EagerAttention.__call__` where the attention tests left mutants alive
(issue 29, item 6; docs/results/mutation/run8_attention/): the refusal of causal=False with its
message, the mask built on the inputs' device, per-head sinks with several rows, and the backend
class forwarding every option to the function."""

import math

import pytest
import torch

from moe.attention.document_mask import document_causal_mask
from moe.attention.eager import EagerAttention, eager_attention

MESSAGE = "a sliding window or a document mask is a causal mask; got causal=False"


def _qkv(B=2, H=4, G=2, T=6, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, d, generator=g), torch.randn(B, G, T, d, generator=g),
            torch.randn(B, G, T, d, generator=g))


def _segments():
    return document_causal_mask(torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1]]))


@pytest.mark.parametrize("option", ["window", "attn_mask"])
def test_non_causal_with_a_window_or_document_mask_is_refused_with_the_whole_message(option):
    q, k, v = _qkv()
    kwargs = {"window": 2} if option == "window" else {"attn_mask": _segments()}
    with pytest.raises(ValueError) as err:
        eager_attention(q, k, v, causal=False, **kwargs)
    assert str(err.value) == MESSAGE
    assert "document mask" in str(err.value) and "causal=False" in str(err.value)


@pytest.mark.parametrize("window, with_sinks, with_doc", [(2, False, False), (2, True, False), (None, False, True),
                                                          (None, True, True), (2, True, True)])
def test_the_mask_follows_the_inputs_device_not_the_default_device(window, with_sinks, with_doc):
    # the inputs are on cpu and torch's default device is switched to meta: a mask built on the
    # default device instead of the inputs' lands on meta and cannot meet the cpu scores. The
    # same holds for any pair of devices (a cuda input with a cpu default), so this is no cpu-only check
    q, k, v = _qkv()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0]) if with_sinks else None
    mask = _segments() if with_doc else None
    want = eager_attention(q, k, v, True, window, sinks, mask)
    with torch.device("meta"):
        out = eager_attention(q, k, v, True, window, sinks, mask)
    assert out.device.type == "cpu" and torch.equal(out, want)


def test_per_head_sinks_with_several_rows_match_a_hand_computation():
    # B=2 rows, H=4 query heads on G=2 kv heads, T=3 != H: each (row, head, query) softmax gets its
    # own head's sink in the denominator
    q, k, v = _qkv(B=2, H=4, G=2, T=3)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    out = eager_attention(q, k, v, True, None, sinks)
    ref = torch.empty_like(out)
    for b in range(2):
        for h in range(4):
            kh, vh = k[b, h // 2], v[b, h // 2]
            for t in range(3):
                logits = q[b, h, t] @ kh[: t + 1].T / math.sqrt(8)
                w = torch.exp(logits.double())
                w = w / (w.sum() + math.exp(float(sinks[h])))
                ref[b, h, t] = (w.float()[:, None] * vh[: t + 1]).sum(0)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_the_class_is_causal_by_default():
    q, k, v = _qkv()
    assert torch.equal(EagerAttention()(q, k, v), eager_attention(q, k, v, True))
    assert not torch.allclose(EagerAttention()(q, k, v), eager_attention(q, k, v, False))


@pytest.mark.parametrize("window, with_sinks, with_doc", [(2, False, False), (None, True, False), (None, False, True),
                                                          (2, True, True)])
def test_the_class_forwards_every_option(window, with_sinks, with_doc):
    q, k, v = _qkv()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0]) if with_sinks else None
    mask = _segments() if with_doc else None
    want = eager_attention(q, k, v, True, window, sinks, mask)
    assert torch.equal(EagerAttention()(q, k, v, True, window, sinks, mask), want)
    assert torch.equal(EagerAttention()(q, k, v, window=window, sinks_H=sinks, attn_mask=mask), want)
    # each option given changes the result here, so a class that dropped one would be seen
    without = []
    if window is not None:
        without.append(eager_attention(q, k, v, True, None, sinks, mask))
    if with_sinks:
        without.append(eager_attention(q, k, v, True, window, None, mask))
    if with_doc:
        without.append(eager_attention(q, k, v, True, window, sinks, None))
    for other in without:
        assert not torch.allclose(other, want, atol=1e-3)
