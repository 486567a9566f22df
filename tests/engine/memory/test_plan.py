"""The memory plan (moe.engine.memory.plan, and the GPU path of moe.engine.memory.cache_size): its arithmetic
against plain formulas, and the command line on an HF config.json."""

import json

import pytest
import torch

from moe.config.schema import ModelConfig
from moe.engine import EngineConfig
from moe.engine.memory import cache_size, memory_profile
from moe.engine.memory.plan import main, parse_bytes, plan_model
from moe.errors import ConfigError
from moe.model import Transformer

CFG = ModelConfig(vocab_size=512, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=96,
                  max_seq_len=1024)


def test_plan_arithmetic():
    with torch.device("meta"):
        n_params = Transformer(CFG).num_params()
    plan = plan_model(CFG, 10**9, torch.bfloat16, max_num_batched_tokens=256, max_num_seqs=8, block_size=16)
    assert plan.weights == n_params * 2  # parameters x bf16 size
    assert plan.kv_bytes_per_block == 2 * 3 * 16 * 2 * 16 * 2  # K+V x layers x block x kv heads x head dim x 2 B
    assert plan.reserve == 2**30 > 0.05 * 10**9  # at least 1 GiB
    assert plan.kv_cache == 10**9 - plan.weights - plan.activations - plan.reserve < 0
    assert plan.num_blocks == 0 and "DOES NOT FIT" in plan.lines()[-1]
    big = plan_model(CFG, 100 * 2**30, torch.float32, 256, 8, reserve=5 * 2**30)
    assert big.weights == n_params * 4 and big.reserve == 5 * 2**30
    assert big.num_blocks == (100 * 2**30 - big.weights - big.activations - 5 * 2**30) // big.kv_bytes_per_block
    # activations: at least the fp32 logits rows and one layer's sorted-dispatch buffers, and they grow with tokens
    assert big.activations > 8 * 512 * 4 + 256 * 2 * 2 * 96 * 4
    assert plan_model(CFG, 10**9, torch.float32, 512, 8).activations > 1.8 * big.activations


def test_parse_bytes():
    assert parse_bytes("141GB") == 141 * 10**9 and parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("1.5e9B") == 1_500_000_000
    with pytest.raises(ConfigError, match="--device-memory='lots' is not a size"):
        parse_bytes("lots")
    with pytest.raises(ConfigError, match=r"--device-memory='80' has no unit; write a number with a unit, e.g. "
                                          r"141GB, 80GiB"):
        parse_bytes("80")  # not 80 bytes


def test_command_line_on_an_hf_config(tmp_path, capsys):
    config = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 64,
              "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 3,
              "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 512, "max_position_embeddings": 1024,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main([str(tmp_path / "config.json"), "--device-memory", "2GiB", "--dtype", "fp32",
                 "--max-num-batched-tokens", "256", "--max-num-seqs", "8", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = plan_model(CFG, 2 * 2**30, torch.float32, 256, 8)
    assert got["weights"] == want.weights and got["activations"] == want.activations
    assert got["num_blocks"] == want.num_blocks > 0
    assert main([str(tmp_path), "--device-memory", "2GiB"]) == 0  # the directory; bf16; text
    assert "= KV cache" in capsys.readouterr().out
    assert main([str(tmp_path), "--device-memory", "two"]) == 2
    assert "error: --device-memory='two' is not a size" in capsys.readouterr().err
    assert main([str(tmp_path), "--device-memory", "80"]) == 2
    assert "error: --device-memory='80' has no unit" in capsys.readouterr().err
    assert main([str(tmp_path), "--device-memory", "1GB"]) == 1  # planned, and it does not fit: exit 1
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert main([str(tmp_path), "--device-memory", "1GB", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["fits"] is False


def test_gpu_cache_is_free_memory_less_measured_peak_and_reserve(monkeypatch):
    GiB = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (60 * GiB, 80 * GiB))
    monkeypatch.setattr(memory_profile, "measure_peak_activations", lambda model, t, r: 3 * GiB + t)
    per_block = 2**20
    n = cache_size.num_kv_blocks(EngineConfig(max_num_batched_tokens=4096), per_block, 64, torch.device("cuda"),
                                 model=object())
    assert n == (60 * GiB - (3 * GiB + 4096) - 4 * GiB) // per_block  # reserve: 5% of 80 GiB
    # an explicit fraction keeps the old rule; no room left is a clear error
    assert cache_size.num_kv_blocks(EngineConfig(kv_cache_memory_fraction=0.5), per_block, 64,
                                    torch.device("cuda"), model=object()) == 30 * GiB // per_block
    # compile / a default speculative method (allocated after the cache, not planned): the 80% rule
    assert cache_size.num_kv_blocks(EngineConfig(compile=True), per_block, 64, torch.device("cuda"),
                                    model=object()) == int(60 * GiB * 0.8) // per_block
    monkeypatch.setattr(memory_profile, "measure_peak_activations", lambda model, t, r: 57 * GiB)
    with pytest.raises(ConfigError, match="no GPU memory is left for the KV cache"):
        cache_size.num_kv_blocks(EngineConfig(), per_block, 64, torch.device("cuda"), model=object())
