"""Sliding windows and attention sinks in the training backends (eager, sdpa), the refusals of
the backends that cannot honour them, and the model options that choose them per layer."""

import math

import pytest
import torch

from moe.attention import ATTENTION_BACKENDS, PAGED_BACKENDS, eager_attention
from moe.config import ModelConfig, validate_model
from moe.errors import ConfigError


def _qkv(B=2, H=4, G=2, T=9, S=9, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, d, generator=g, dtype=torch.float64),
            torch.randn(B, G, S, d, generator=g, dtype=torch.float64),
            torch.randn(B, G, S, d, generator=g, dtype=torch.float64))


def _by_hand(q, k, v, window, sinks):
    """One query at a time: the keys it may see, exp-weights, the sink in the denominator."""
    B, H, T, d = q.shape
    S, rep = k.shape[2], H // k.shape[1]
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                pos = S - T + t
                keys = [j for j in range(S) if j <= pos and (window is None or j > pos - window)]
                logits = torch.stack([q[b, h, t] @ k[b, h // rep, j] / math.sqrt(d) for j in keys])
                z = torch.exp(logits).sum() + (math.exp(float(sinks[h])) if sinks is not None else 0.0)
                out[b, h, t] = sum(torch.exp(lg) / z * v[b, h // rep, j] for lg, j in zip(logits, keys))
    return out


@pytest.mark.parametrize("window", [None, 1, 3])
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("T", [9, 4])  # T < S: the queries are the last T positions
def test_eager_matches_a_hand_computation(window, with_sinks, T):
    q, k, v = _qkv(T=T)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64) if with_sinks else None
    # (eager takes its softmax in fp32)
    torch.testing.assert_close(eager_attention(q, k, v, True, window, sinks), _by_hand(q, k, v, window, sinks),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 2, 5])
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("heads", [(4, 2), (4, 4)])
def test_sdpa_equals_eager(window, with_sinks, heads):
    q, k, v = (t.float() for t in _qkv(H=heads[0], G=heads[1], T=7, S=7))
    sinks = torch.randn(heads[0]) if with_sinks else None
    sdpa = ATTENTION_BACKENDS.get("sdpa")()
    torch.testing.assert_close(sdpa(q, k, v, True, window, sinks), eager_attention(q, k, v, True, window, sinks),
                               atol=1e-5, rtol=1e-5)


def test_a_window_changes_the_output_and_a_wide_one_does_not():
    q, k, v = _qkv(T=9, S=9)
    full = eager_attention(q, k, v)
    assert torch.equal(eager_attention(q, k, v, True, 9), full)
    assert not torch.allclose(eager_attention(q, k, v, True, 3), full)


def test_sinks_get_gradients_through_sdpa():
    q, k, v = (t.float() for t in _qkv(T=5, S=5))
    sinks = torch.zeros(4, requires_grad=True)
    ATTENTION_BACKENDS.get("sdpa")()(q, k, v, True, 2, sinks).sum().backward()
    assert sinks.grad is not None and sinks.grad.abs().sum() > 0


@pytest.mark.parametrize("kind,name", [("train", "flash"), ("paged", "flash")])
def test_backends_without_sinks_refuse_them_naming_both_options(kind, name):
    cls = (ATTENTION_BACKENDS if kind == "train" else PAGED_BACKENDS).lookup(name)
    option = "attention.name" if kind == "train" else "attention_backend"
    with pytest.raises(ConfigError, match=rf"model.attention_sinks=true .*{option}='{name}'"):
        cls.check_layer_options(None, True)


def test_triton_paged_serves_windows_and_sinks():
    cls = PAGED_BACKENDS.lookup("triton")
    cls.check_model(ModelConfig(sliding_window=4, attention_sinks=True))  # its kernels take both
    cls.check_model(ModelConfig())


@pytest.mark.parametrize("fields,match", [
    (dict(layer_types=["full", "sliding"]), "one per layer"),
    (dict(layer_types=["full", "local", "full", "full"]), r"layer_types\[1\]='local'"),
    (dict(layer_types=["sliding", "full", "full", "full"]), "sliding_window is not set"),
    (dict(layer_types=["full"] * 4, sliding_window=8), "has no effect"),
    (dict(sliding_window=0), "sliding_window=0"),
    (dict(expert_activation="gelu"), "model.expert_activation='gelu'"),
])
def test_bad_layer_options_are_config_errors(fields, match):
    with pytest.raises(ConfigError, match=match):
        validate_model(ModelConfig(**fields))


def test_layer_window_follows_layer_types():
    assert [ModelConfig(sliding_window=5).layer_window(i) for i in range(4)] == [5] * 4
    cfg = ModelConfig(layer_types=["sliding", "full", "sliding", "full"], sliding_window=5)
    assert [cfg.layer_window(i) for i in range(4)] == [5, None, 5, None]
    assert [ModelConfig().layer_window(i) for i in range(4)] == [None] * 4


def test_auto_paged_backend_takes_triton_with_windows_and_sinks(monkeypatch):
    from moe.attention import paged_backend
    monkeypatch.setattr(PAGED_BACKENDS, "unavailable_reason", lambda name: None)  # as on a CUDA machine
    monkeypatch.setattr(PAGED_BACKENDS, "get", lambda name: PAGED_BACKENDS.lookup(name))
    assert paged_backend("auto", "cuda", ModelConfig()).name == "triton"
    # the Triton kernels take windows and sinks (GPT-OSS): auto keeps triton for them
    assert paged_backend("auto", "cuda", ModelConfig(attention_sinks=True)).name == "triton"
    assert paged_backend("auto", "cuda", ModelConfig(sliding_window=8)).name == "triton"
