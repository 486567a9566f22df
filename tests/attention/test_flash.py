"""The `flash` attention backends (`moe/attention/flash.py`): a clear UnavailableError at model (or
engine) construction when flash-attn (or a CUDA GPU) is missing, one availability check for the
training and the paged backend, a clear error when called on CPU / in fp32, and the layout plumbing
([B, H, T, d] <-> flash's [B, T, H, d], GQA, causal) checked against `eager` with a stand-in
flash_attn_func."""

import importlib.util
import sys
import types

import pytest
import torch

import moe.attention.flash as flash
from moe.attention import ATTENTION_BACKENDS, PAGED_BACKENDS, eager_attention, paged_backend
from moe.routing.routers import router_config
from moe.errors import ConfigError, UnavailableError
from moe.model import Transformer
from tests.conftest import tiny_model_config, with_variants

HAS_FLASH = importlib.util.find_spec("flash_attn") is not None


def _fake_flash_attn(monkeypatch, calls=None):
    """Install a stand-in `flash_attn` module whose flash_attn_func is eager attention in flash's layout."""

    def flash_attn_func(q_BTHd, k_BSGd, v_BSGd, dropout_p=0.0, softmax_scale=None, causal=False):
        assert q_BTHd.stride(-1) == 1 and k_BSGd.stride(-1) == 1  # flash needs a contiguous last dim
        if calls is not None:
            calls.append((tuple(q_BTHd.shape), tuple(k_BSGd.shape), causal))
        o = eager_attention(q_BTHd.transpose(1, 2), k_BSGd.transpose(1, 2), v_BSGd.transpose(1, 2), causal)
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
def test_missing_flash_attn_fails_at_model_and_engine_construction():
    msg = ("attention.name='flash' needs flash-attn, which is not installed: pip install -e '.[gpu]' "
           "(flash-attn>=2.6)")
    assert ATTENTION_BACKENDS.unavailable_reason("flash") == msg
    with pytest.raises(UnavailableError) as e:
        Transformer(with_variants(tiny_model_config(), router_config(), attention="flash"))
    assert str(e.value) == msg and isinstance(e.value, ConfigError)
    with pytest.raises(UnavailableError, match=r"pip install -e '\.\[gpu\]'"):
        ATTENTION_BACKENDS.get("flash")
    # The paged backend asks the same check, naming its own option.
    with pytest.raises(UnavailableError, match=r"attention_backend='flash' needs flash-attn, which is not installed"):
        paged_backend("flash", torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error path")
def test_flash_on_a_machine_without_cuda_fails_at_start_up(monkeypatch):
    _fake_flash_attn(monkeypatch)
    assert "needs a CUDA GPU" in ATTENTION_BACKENDS.unavailable_reason("flash")
    assert "needs a CUDA GPU" in PAGED_BACKENDS.unavailable_reason("flash")
    with pytest.raises(UnavailableError, match="needs a CUDA GPU.*sdpa"):
        Transformer(with_variants(tiny_model_config(), router_config(), attention="flash"))


def test_flash_rejects_cpu_and_fp32_tensors_clearly(monkeypatch):
    _fake_flash_attn(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    backend = ATTENTION_BACKENDS.get("flash")()  # "available": construction would pass
    q = torch.randn(1, 4, 5, 8)
    with pytest.raises(RuntimeError, match="runs on CUDA tensors; got q on cpu"):
        backend(q, q[:, :2], q[:, :2])


@pytest.mark.parametrize("H,G,T", [(4, 2, 7), (4, 4, 5), (6, 1, 9)])
def test_flash_layout_gqa_and_causal_match_eager(monkeypatch, H, G, T):
    calls = []
    _fake_flash_attn(monkeypatch, calls)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(flash, "_input_error", lambda q, k, v: None)  # CPU tensors stand in for CUDA
    B, d = 2, 8
    q, k, v = torch.randn(B, H, T, d), torch.randn(B, G, T, d), torch.randn(B, G, T, d)
    out = ATTENTION_BACKENDS.get("flash")()(q, k, v, causal=True)
    assert calls == [((B, T, H, d), (B, T, G, d), True)]  # flash sees [B, T, heads, d] and G kv heads (no repeat)
    torch.testing.assert_close(out, eager_attention(q, k, v, causal=True), atol=1e-5, rtol=1e-5)


def _cuda_like(dtype, d):
    """A stand-in with the attributes the input check reads, as a CUDA tensor would have them."""
    return types.SimpleNamespace(device=torch.device("cuda", 0), dtype=dtype, shape=(1, 4, 5, d))


def test_flash_input_checks():
    cpu = torch.randn(1, 4, 5, 8)
    assert "CUDA" in flash._input_error(cpu, cpu, cpu)
    f32 = _cuda_like(torch.float32, 64)
    assert "fp16/bf16" in flash._input_error(f32, f32, f32)
    assert "train.dtype=bf16" in flash._input_error(f32, f32, f32)
    bf = _cuda_like(torch.bfloat16, 64)
    assert flash._input_error(bf, bf, bf) is None
    odd = _cuda_like(torch.bfloat16, 12)
    assert "multiple of 8" in flash._input_error(odd, odd, odd)


@pytest.mark.skipif(not (HAS_FLASH and torch.cuda.is_available()), reason="needs flash-attn and CUDA")
def test_real_flash_matches_eager_on_cuda():
    q = torch.randn(2, 8, 64, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
    out = ATTENTION_BACKENDS.get("flash")()(q, k, v)
    torch.testing.assert_close(out, eager_attention(q, k, v), atol=2e-2, rtol=2e-2)
