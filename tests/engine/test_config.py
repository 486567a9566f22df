"""`EngineConfig`: every option has a rejected bad value whose ConfigError names the field (and
what is allowed); unknown options to `LLM(...)` are named; good values are normalized."""

import dataclasses

import pytest
import torch

from moe.engine import LLM, EngineConfig
from moe.errors import ConfigError

BAD = [
    ("block_size", 0), ("block_size", 2.0), ("block_size", True),
    ("num_blocks", 0), ("num_blocks", "many"),
    ("kv_cache_memory_bytes", -1), ("kv_cache_memory_bytes", 1.5),
    ("kv_cache_memory_fraction", 0.0), ("kv_cache_memory_fraction", 2.0), ("kv_cache_memory_fraction", float("nan")),
    ("enable_prefix_caching", "yes"),
    ("max_num_seqs", 0), ("max_num_batched_tokens", -4),
    ("max_model_len", 1), ("max_model_len", 64.0),
    ("attention_backend", "nope"), ("attention_backend", 3),
    ("device", "gpu"), ("dtype", "int8"),
    ("seed", "s"), ("seed", 1.5),
    ("add_bos", 1), ("collect_routing_stats", None), ("compile", "yes"), ("allow_long_context", "yes"),
    ("check_invariants", "on"), ("tf32", "on"),
    ("profile", 5), ("profile", "on"),
    ("speculative", "medusa"), ("speculative", {"method": "ngram", "num_tokens": 0}),
    ("kv_cache_dtype", "fp8"), ("kv_cache_dtype", None),
    ("expert_cache", 5), ("expert_cache", "8GB"),
    ("tensor_parallel_size", 0), ("tensor_parallel_size", 1.5), ("expert_parallel", "yes"),
]


def test_every_field_has_a_bad_value_here():
    assert {name for name, _ in BAD} == set(EngineConfig.option_names())


@pytest.mark.parametrize("field,value", BAD, ids=[f"{f}={v!r}" for f, v in BAD])
def test_bad_value_names_the_field(field, value):
    with pytest.raises(ConfigError, match=f"^{field}=") as e:
        EngineConfig(**{field: value})
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("field,value,allowed", [
    ("attention_backend", "nope", ["'auto'", "torch", "triton", "flash"]),
    ("dtype", "int8", ["bf16", "fp32"]),
    ("kv_cache_memory_fraction", 2.0, ["(0, 1]"]),
    ("kv_cache_dtype", "fp8", ["auto", "fp8_e4m3"]),
    ("device", "gpu", ["'cpu'", "'cuda'"]),
])
def test_messages_say_what_is_allowed(field, value, allowed):
    with pytest.raises(ConfigError) as e:
        EngineConfig(**{field: value})
    assert all(a in str(e.value) for a in allowed), str(e.value)


def test_defaults_and_normalization():
    c = EngineConfig()
    assert (c.block_size, c.max_num_seqs, c.max_num_batched_tokens, c.attention_backend) == (16, 64, 2048, "auto")
    assert c.device is None and c.dtype is None and c.num_blocks is None and c.enable_prefix_caching
    c = EngineConfig(device="cpu", dtype="bf16", attention_backend="torch", kv_cache_memory_fraction=1)
    assert c.device == torch.device("cpu") and c.dtype == torch.bfloat16
    assert dataclasses.replace(c, seed=3).seed == 3  # replace re-validates
    with pytest.raises(ConfigError, match="seed"):
        dataclasses.replace(c, seed="x")


def test_unknown_options_are_named(model):
    with pytest.raises(ConfigError, match=r"unknown engine option\(s\) \['max_num_seq'\].*max_num_seqs"):
        EngineConfig.from_options({"max_num_seq": 4, "block_size": 8})
    with pytest.raises(ConfigError, match=r"\['blocksize', 'gpu_memory_utilization'\]"):
        LLM.from_model(model, None, blocksize=8, gpu_memory_utilization=0.9)
    with pytest.raises(ConfigError, match="block_size"):
        LLM("/nonexistent/checkpoint.pt", block_size=0)  # before the checkpoint is even looked at


# moved from test_llm.py: the same checks through LLM.from_model
@pytest.mark.parametrize("opts,match", [
    (dict(attention_backend="nope"), "attention_backend"), (dict(block_size=0), "block_size"),
    (dict(dtype="int8"), "dtype"), (dict(max_num_seqs=0), "max_num_seqs"), (dict(num_blocks=0), "num_blocks"),
    (dict(kv_cache_memory_fraction=2.0), "kv_cache_memory_fraction"),
])
def test_bad_options_raise(model, opts, match):
    with pytest.raises(ValueError, match=match):
        LLM.from_model(model, None, **opts)


def test_flash_backend_missing_names_the_extra(model):
    import importlib.util
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed")
    from moe.errors import UnavailableError
    with pytest.raises(UnavailableError, match=r"attention_backend='flash' needs flash-attn.*\[gpu\]"):
        LLM.from_model(model, None, attention_backend="flash")


def test_compile_with_an_fp8_kv_cache_is_refused_by_name():
    with pytest.raises(ConfigError, match="^kv_cache_dtype='fp8_e4m3' is not supported with compile=True"):
        EngineConfig(compile=True, kv_cache_dtype="fp8_e4m3")


def test_tf32_option_reaches_the_cuda_flags(monkeypatch):
    """`tf32` (default True) is applied by both constructors: `LLM(path)` through device_defaults
    (logged with the dtype), `LLM.from_model` directly; on CUDA it sets torch's TF32 flags."""
    import moe.engine.core.llm as llm_mod
    from moe.config import ModelConfig
    from moe.model import Transformer
    from moe.perf import set_tf32
    calls = []
    monkeypatch.setattr(llm_mod, "set_tf32", lambda device, tf32: calls.append((device.type, tf32)))
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, n_experts=2,
                                    expert_hidden=16, max_seq_len=32))
    LLM.from_model(model, num_blocks=8, tf32=False)
    LLM.from_model(model, num_blocks=8)
    assert calls == [("cpu", False), ("cpu", True)]
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
              torch.get_float32_matmul_precision())
    try:  # the flags themselves (no GPU needed to set them)
        assert set_tf32(torch.device("cuda"), False) == "off" and not torch.backends.cuda.matmul.allow_tf32
        assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
        assert set_tf32(torch.device("cuda"), True) == "on" and torch.backends.cuda.matmul.allow_tf32
        assert set_tf32(torch.device("cpu"), False) == "n/a on cpu" and torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[:2]
        torch.set_float32_matmul_precision(before[2])
