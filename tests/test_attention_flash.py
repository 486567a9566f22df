"""The `flash` attention backend: a clear ConfigError at model construction when flash-attn (or a
CUDA GPU) is missing, a clear error when called on CPU / in fp32, and the layout plumbing
([B, H, T, d] <-> flash's [B, T, H, d], GQA, causal) checked against `eager` with a stand-in
flash_attn_func."""

import importlib.util
import sys
import types

import pytest
import torch

import moe.attention as attention
from moe.attention import ATTENTION_BACKENDS, backend_unavailable_reason
from moe.config import ConfigError, RouterConfig
from moe.model import Transformer
from tests.conftest import tiny_model_config

HAS_FLASH = importlib.util.find_spec("flash_attn") is not None


@pytest.fixture
def no_flash_cache(monkeypatch):
    monkeypatch.setattr(attention, "_flash_fn", None)


def _fake_flash_attn(monkeypatch, calls=None):
    """Install a stand-in `flash_attn` module whose flash_attn_func is eager attention in flash's layout."""

    def flash_attn_func(q_BTHd, k_BSGd, v_BSGd, dropout_p=0.0, softmax_scale=None, causal=False):
        assert q_BTHd.stride(-1) == 1 and k_BSGd.stride(-1) == 1  # flash needs a contiguous last dim
        if calls is not None:
            calls.append((tuple(q_BTHd.shape), tuple(k_BSGd.shape), causal))
        o = attention.eager_attention(q_BTHd.transpose(1, 2), k_BSGd.transpose(1, 2), v_BSGd.transpose(1, 2), causal)
        return o.transpose(1, 2)

    mod = types.ModuleType("flash_attn")
    mod.flash_attn_func = flash_attn_func
    mod.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
    monkeypatch.setitem(sys.modules, "flash_attn", mod)


def test_flash_is_registered_with_a_config_file():
    assert "flash" in ATTENTION_BACKENDS
    from tests.conftest import REPO
    assert (REPO / "configs" / "attention" / "flash.yaml").read_text().startswith("name: flash")


@pytest.mark.skipif(HAS_FLASH, reason="flash-attn is installed")
def test_missing_flash_attn_fails_at_model_construction(no_flash_cache):
    msg = "attention.name='flash' needs the flash-attn package: pip install -e '.[gpu]'"
    assert backend_unavailable_reason("flash") == msg
    with pytest.raises(ConfigError) as e:
        Transformer(tiny_model_config(), RouterConfig(), attention="flash")
    assert str(e.value) == msg
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[gpu\]'"):
        ATTENTION_BACKENDS.get("flash")
    q = torch.randn(1, 4, 5, 8)
    with pytest.raises(ConfigError, match="needs the flash-attn package"):
        attention.flash_attention(q, q[:, :2], q[:, :2])  # called directly, bypassing the registry


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error path")
def test_flash_on_a_machine_without_cuda_fails_at_start_up(monkeypatch, no_flash_cache):
    _fake_flash_attn(monkeypatch)
    assert "needs a CUDA GPU" in backend_unavailable_reason("flash")
    with pytest.raises(ConfigError, match="needs a CUDA GPU.*attention.name=sdpa"):
        Transformer(tiny_model_config(), RouterConfig(), attention="flash")


def test_flash_rejects_cpu_and_fp32_tensors_clearly(monkeypatch, no_flash_cache):
    _fake_flash_attn(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ATTENTION_BACKENDS.get("flash")  # "available": construction would pass
    q = torch.randn(1, 4, 5, 8)
    with pytest.raises(RuntimeError, match="runs on CUDA tensors; got q on cpu"):
        attention.flash_attention(q, q[:, :2], q[:, :2])


@pytest.mark.parametrize("H,G,T", [(4, 2, 7), (4, 4, 5), (6, 1, 9)])
def test_flash_layout_gqa_and_causal_match_eager(monkeypatch, no_flash_cache, H, G, T):
    calls = []
    _fake_flash_attn(monkeypatch, calls)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(attention, "_flash_input_error", lambda q, k, v: None)  # CPU tensors stand in for CUDA
    B, d = 2, 8
    q, k, v = torch.randn(B, H, T, d), torch.randn(B, G, T, d), torch.randn(B, G, T, d)
    out = ATTENTION_BACKENDS.get("flash")(q, k, v, causal=True)
    assert calls == [((B, T, H, d), (B, T, G, d), True)]  # flash sees [B, T, heads, d] and G kv heads (no repeat)
    torch.testing.assert_close(out, attention.eager_attention(q, k, v, causal=True), atol=1e-5, rtol=1e-5)


def _cuda_like(dtype, d):
    """A stand-in with the attributes the input check reads, as a CUDA tensor would have them."""
    return types.SimpleNamespace(device=torch.device("cuda", 0), dtype=dtype, shape=(1, 4, 5, d))


def test_flash_input_checks():
    cpu = torch.randn(1, 4, 5, 8)
    assert "CUDA" in attention._flash_input_error(cpu, cpu, cpu)
    f32 = _cuda_like(torch.float32, 64)
    assert "fp16/bf16" in attention._flash_input_error(f32, f32, f32)
    assert "train.dtype=bf16" in attention._flash_input_error(f32, f32, f32)
    bf = _cuda_like(torch.bfloat16, 64)
    assert attention._flash_input_error(bf, bf, bf) is None
    odd = _cuda_like(torch.bfloat16, 12)
    assert "multiple of 8" in attention._flash_input_error(odd, odd, odd)


@pytest.mark.skipif(not (HAS_FLASH and torch.cuda.is_available()), reason="needs flash-attn and CUDA")
def test_real_flash_matches_eager_on_cuda():
    q = torch.randn(2, 8, 64, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
    out = ATTENTION_BACKENDS.get("flash")(q, k, v)
    torch.testing.assert_close(out, attention.eager_attention(q, k, v), atol=2e-2, rtol=2e-2)
