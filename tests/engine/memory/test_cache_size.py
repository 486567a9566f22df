"""KV cache sizing: explicit block counts, a byte budget, a memory fraction, the CPU default."""

import pytest
import torch

from moe.engine import LLM, EngineConfig
from moe.engine.memory.cache_size import CPU_FRACTION, num_kv_blocks
from moe.errors import ConfigError

CPU = torch.device("cpu")


def test_cache_sizing(model):  # moved from test_llm.py: through LLM.from_model on the test model
    per_block = 2 * 2 * 16 * 2 * 16 * 4  # K+V, layers, block, kv heads, head dim, fp32
    assert LLM.from_model(model, None, kv_cache_memory_bytes=10 * per_block + 5).num_blocks == 10
    assert LLM.from_model(model, None, num_blocks=3).num_blocks == 3
    assert LLM.from_model(model, None, max_num_seqs=4).num_blocks == 4 * 256 // 16
    with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
        LLM.from_model(model, None, kv_cache_memory_bytes=10)


def test_order_of_precedence():
    # num_blocks wins over a byte budget, which wins over a fraction
    assert num_kv_blocks(EngineConfig(num_blocks=7, kv_cache_memory_bytes=10**9), 1000, 64, CPU) == 7
    assert num_kv_blocks(EngineConfig(kv_cache_memory_bytes=4500, kv_cache_memory_fraction=1.0), 1000, 64, CPU) == 4
    with pytest.raises(ConfigError, match=r"kv_cache_memory_bytes=999 is less than one KV block \(1000 bytes\)"):
        num_kv_blocks(EngineConfig(kv_cache_memory_bytes=999), 1000, 64, CPU)


def test_cpu_default_is_full_length_sequences_within_a_ram_share():
    # 3 sequences of 100 tokens in blocks of 16: 3 x 7 blocks (tiny blocks: RAM is no limit)
    assert num_kv_blocks(EngineConfig(max_num_seqs=3), 1, 100, CPU) == 21
    # huge blocks: capped by a quarter of the RAM, but never below one block
    assert num_kv_blocks(EngineConfig(max_num_seqs=3), 2**62, 100, CPU) == 1
    # a fraction of the RAM replaces the full-length rule: more blocks than 3 sequences need
    assert num_kv_blocks(EngineConfig(max_num_seqs=3, kv_cache_memory_fraction=CPU_FRACTION), 1, 100, CPU) > 21
