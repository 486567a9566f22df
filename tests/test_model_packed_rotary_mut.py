"""Added by the eighth mutation run of the decode step (docs/results/mutation/run8_decode/): the attention
layer rotating q and k as one packed tensor when it has no qk-norm and no clipping (`Attention.forward`),
each test written against mutants of that change the first-pass tests let live."""

import pytest
import torch

import moe.model as model
from moe.model import Attention, Rotary
from tests.conftest import tiny_model_config


def _rotary_calls(monkeypatch):
    """The shapes of the tensors moe.model.apply_rotary is called on (the layer's forward looks it up there)."""
    calls, real = [], model.apply_rotary

    def counting(x, cos, sin):
        calls.append(tuple(x.shape))
        return real(x, cos, sin)

    monkeypatch.setattr(model, "apply_rotary", counting)
    return calls


@pytest.mark.parametrize("opts, packed", [
    (dict(), True),
    (dict(qk_norm="full"), False), (dict(qk_norm="head"), False), (dict(clip_qkv=0.5), False),
    (dict(qk_norm="head", clip_qkv=0.5), False)])
def test_the_packed_rotation_is_taken_exactly_without_qk_norm_and_clipping(monkeypatch, opts, packed):
    """No qk-norm and no clipping: one rotary call on the packed [B, H + G, T, d] queries and keys (the
    point of the change: half the calls a layer); with either option, q and k are rotated one by one."""
    cfg = tiny_model_config(n_heads=4, n_kv_heads=2, **opts)
    torch.manual_seed(0)
    layer = Attention(cfg, 0)
    H, G, d = layer.n_heads, layer.n_kv_heads, layer.head_dim
    B, T = 2, 3
    cos, sin = Rotary(cfg)(torch.arange(T).expand(B, T))
    calls = _rotary_calls(monkeypatch)
    out = layer(torch.randn(B, T, cfg.d_model), cos, sin)
    assert out.shape == (B, T, cfg.d_model)
    assert calls == ([(B, H + G, T, d)] if packed else [(B, H, T, d), (B, G, T, d)])


@pytest.mark.parametrize("opts", [dict(), dict(qk_norm="head")], ids=["packed", "one-by-one"])
def test_the_layer_hands_its_document_mask_to_the_backend(opts):
    """Packed training rows (model.document_mask): the layer's `attn_mask` reaches the attention backend, so
    the second document of a row, positions restarted, gives what the layer gives on that document alone."""
    from moe.attention.document_mask import document_causal_mask
    cfg = tiny_model_config(n_heads=4, n_kv_heads=2, **opts)
    torch.manual_seed(0)
    layer = Attention(cfg, 0)
    rot = Rotary(cfg)
    x = torch.randn(1, 6, cfg.d_model)
    cos, sin = rot(torch.tensor([[0, 1, 2, 0, 1, 2]]))
    got = layer(x, cos, sin, attn_mask=document_causal_mask(torch.tensor([[0, 0, 0, 1, 1, 1]])))
    cos2, sin2 = rot(torch.tensor([[0, 1, 2]]))
    alone = layer(x[:, 3:], cos2, sin2)
    torch.testing.assert_close(got[:, 3:], alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[:, :3], layer(x[:, :3], cos2, sin2), rtol=1e-5, atol=1e-5)


class _RecordingContext:
    """An inference kv context recording what each layer asks of it (the keywords it passes)."""

    def __init__(self):
        self.calls = []

    def attend(self, layer_idx, q, k, v, **kw):
        self.calls.append((layer_idx, tuple(q.shape), tuple(k.shape), tuple(v.shape), kw))
        return torch.zeros_like(q)


@pytest.mark.parametrize("opts, want", [
    (dict(), {}),
    (dict(sliding_window=4), dict(window=4, sinks_H=None)),
    (dict(attention_sinks=True), dict(window=None, sinks_H="sinks")),
    (dict(sliding_window=4, attention_sinks=True), dict(window=4, sinks_H="sinks")),
    (dict(sliding_window=4, qk_norm="head"), dict(window=4, sinks_H=None))])
def test_the_layer_hands_its_window_and_sinks_to_the_kv_context(opts, want):
    """Under an inference context the layer calls the context's `attend` with its layer index, q [B, H, T, d],
    k and v [B, G, T, d], and its own sliding window and sink logits (a full-attention layer without sinks:
    no keywords, the context's defaults)."""
    from moe.config import AttentionConfig
    cfg = tiny_model_config(n_heads=4, n_kv_heads=2, attention=AttentionConfig(name="eager"), **opts)
    torch.manual_seed(0)
    layer = Attention(cfg, 1)
    H, G, d = layer.n_heads, layer.n_kv_heads, layer.head_dim
    ctx = _RecordingContext()
    cos, sin = Rotary(cfg)(torch.arange(3).expand(1, 3))
    layer(torch.randn(1, 3, cfg.d_model), cos, sin, kv_context=ctx)
    assert len(ctx.calls) == 1
    idx, qs, ks, vs, kw = ctx.calls[0]
    assert (idx, qs, ks, vs) == (1, (1, H, 3, d), (1, G, 3, d), (1, G, 3, d))
    if want.get("sinks_H") == "sinks":
        assert kw.pop("sinks_H") is layer.sinks
        want = {k: v for k, v in want.items() if k != "sinks_H"}
    assert kw == want
