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
