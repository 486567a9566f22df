"""`moe/attention/eager.py`, the reference every other backend is compared with, against a loop
written here: one query row at a time, scores against the keys it may see, softmax, weighted sum."""

import math

import pytest
import torch

from moe.attention import ATTENTION_BACKENDS
from moe.attention.eager import eager_attention


def per_row_reference(q, k, v, causal: bool) -> torch.Tensor:
    """q [B, H, T, d], k / v [B, G, S, d] in float64: query t of the last T positions sees keys
    0 .. S - T + t when causal (bottom-right alignment), all S otherwise; head h reads kv head h // (H / G)."""
    B, H, T, d = q.shape
    G, S = k.shape[1], k.shape[2]
    out = torch.zeros(B, H, T, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            g = h // (H // G)
            for t in range(T):
                n = S - T + t + 1 if causal else S
                scores = [float(q[b, h, t].double() @ k[b, g, s].double()) / math.sqrt(d) for s in range(n)]
                top = max(scores)
                w = [math.exp(x - top) for x in scores]
                out[b, h, t] = sum(wi * v[b, g, s].double() for s, wi in enumerate(w)) / sum(w)
    return out


@pytest.mark.parametrize("T,S,causal", [(5, 5, True), (3, 7, True), (4, 6, False), (1, 4, True)])
def test_eager_equals_a_per_row_loop(T, S, causal):
    g = torch.Generator().manual_seed(T * 10 + S)
    q, k, v = (torch.randn(2, 4, T, 8, generator=g), torch.randn(2, 2, S, 8, generator=g),
               torch.randn(2, 2, S, 8, generator=g))
    out = ATTENTION_BACKENDS.lookup("eager")()(q, k, v, causal=causal)  # the backend passes `causal` on
    torch.testing.assert_close(out.double(), per_row_reference(q, k, v, causal), atol=1e-5, rtol=1e-5)


def test_causal_is_the_default():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g) for _ in range(3))
    assert torch.equal(eager_attention(q, k, v), eager_attention(q, k, v, causal=True))
    assert not torch.allclose(eager_attention(q, k, v), eager_attention(q, k, v, causal=False))


def test_bf16_inputs_give_bf16_outputs_from_an_fp32_softmax():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 4, 6, 16, generator=g) for _ in range(3))
    out = eager_attention(q.bfloat16(), k[:, :2].bfloat16(), v[:, :2].bfloat16())
    assert out.dtype == torch.bfloat16
    ref = per_row_reference(q.bfloat16().float(), k[:, :2].bfloat16().float(), v[:, :2].bfloat16().float(), True)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
