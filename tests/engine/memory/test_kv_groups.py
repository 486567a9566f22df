"""KV cache groups (moe.engine.memory.kv_groups) and capacity counted at the window: the engine's
cache sizing (cache_size.py) and the planner (`python -m moe.engine.memory.plan`) count a model
whose layers all slide at its window's blocks per sequence, not its full context; a hybrid model
(full + sliding layers sharing each block) and a full one at their full context."""

import json
import math

import pytest
import torch

from moe.config.schema import ModelConfig
from moe.engine import EngineConfig
from moe.engine.memory.cache_size import num_kv_blocks
from moe.engine.memory.kv_groups import KVCacheGroup, blocks_held, engine_window, kv_cache_groups
from moe.engine.memory.plan import main, plan_model

CPU = torch.device("cpu")
BASE = dict(vocab_size=512, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=96,
            max_seq_len=32768)


def test_groups_by_layer_type():
    full = ModelConfig(**BASE)
    assert kv_cache_groups(full) == [KVCacheGroup(None, (0, 1, 2, 3))] and engine_window(full) is None
    sliding = ModelConfig(**BASE, sliding_window=128)  # layer_types null: every layer slides (Mixtral)
    assert kv_cache_groups(sliding) == [KVCacheGroup(128, (0, 1, 2, 3))] and engine_window(sliding) == 128
    hybrid = ModelConfig(**BASE, sliding_window=128, layer_types=["sliding", "full", "sliding", "full"])
    assert kv_cache_groups(hybrid) == [KVCacheGroup(None, (1, 3)), KVCacheGroup(128, (0, 2))]
    assert engine_window(hybrid) is None  # no single window: served per group (moe.engine.memory.hybrid_blocks)


def test_blocks_held_is_the_most_any_step_spans():
    """Against a brute force: the blocks spanned by positions p - w + 1 .. p + n - 1 over every p."""
    for bs in (1, 3, 4, 16):
        for w in (1, 2, 5, 16, 33):
            for chunk in (1, 2, 7, 40):
                total = 120
                worst = max(len({q // bs for q in range(max(0, p - w + 1), min(p + n, total))})
                            for p in range(total) for n in range(1, chunk + 1))
                assert blocks_held(total, bs, w, chunk) == worst, (bs, w, chunk)
    assert blocks_held(100, 16, None, 1) == 7 and blocks_held(10, 4, 100, 1) == 3  # a short sequence: all of it


def test_cpu_default_counts_sequences_at_their_window():
    # 3 sequences of 32768 tokens in blocks of 16: 3 x 2048 blocks full, 3 x 10 at a 128 window (one-token steps:
    # a 2048-token step's chunk may add up to 136 blocks)
    assert num_kv_blocks(EngineConfig(max_num_seqs=3), 1, 32768, CPU) == 3 * 2048
    one = EngineConfig(max_num_seqs=3, max_num_batched_tokens=1)
    assert num_kv_blocks(one, 1, 32768, CPU, sliding_window=128) == 3 * 9
    assert num_kv_blocks(EngineConfig(max_num_seqs=3), 1, 32768, CPU, sliding_window=128) == \
        3 * math.ceil((128 - 1 + 2048 + 15) / 16)


def test_plan_counts_window_layers_at_the_window():
    full = plan_model(ModelConfig(**BASE), 8 * 2**30, torch.bfloat16, 512, 8)
    slide = plan_model(ModelConfig(**BASE, sliding_window=128), 8 * 2**30, torch.bfloat16, 512, 8)
    hybrid = plan_model(ModelConfig(**BASE, sliding_window=128, layer_types=["sliding", "full"] * 2),
                        8 * 2**30, torch.bfloat16, 512, 8)
    assert slide.num_blocks == full.num_blocks == hybrid.num_blocks  # the same bytes a block
    assert full.blocks_per_sequence == hybrid.blocks_per_sequence == 32768 // 16
    assert slide.blocks_per_sequence == math.ceil((128 - 1 + 512 + 15) / 16) == 41
    seqs = lambda plan: float(plan.lines()[4].rsplit(", ", 1)[1].split()[0])  # noqa: E731
    assert seqs(slide) == pytest.approx(slide.num_blocks / 41, abs=0.05)
    assert seqs(full) == pytest.approx(full.num_blocks / 2048, abs=0.05)
    assert "every layer slides over 128 tokens" in "\n".join(slide.lines())


def test_plan_command_line_on_a_sliding_window_config(tmp_path, capsys):
    """A Mixtral config with a window: fits where the same model without one does not."""
    config = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 64,
              "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 3,
              "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 512, "max_position_embeddings": 1 << 20,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}
    args = ["--device-memory", "1100MiB", "--dtype", "fp32", "--max-num-batched-tokens", "64", "--json"]
    (tmp_path / "full.json").write_text(json.dumps(dict(config, sliding_window=None)))
    (tmp_path / "slide.json").write_text(json.dumps(dict(config, sliding_window=4096)))
    assert main([str(tmp_path / "full.json"), *args]) == 1  # one 1M-token sequence does not fit
    full = json.loads(capsys.readouterr().out)
    assert main([str(tmp_path / "slide.json"), *args]) == 0
    slide = json.loads(capsys.readouterr().out)
    assert full["sliding_window"] is None and full["blocks_per_sequence"] == (1 << 20) // 16
    assert slide["sliding_window"] == 4096 and slide["blocks_per_sequence"] == math.ceil((4095 + 64 + 15) / 16)
    assert slide["num_blocks"] == full["num_blocks"] >= slide["blocks_per_sequence"]
