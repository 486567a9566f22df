"""`python -m moe.engine.memory.plan --expert-cache`: the routed experts leave the device weights
but for their slots (checked against the plain formula), and the KV cache gains the difference."""

from __future__ import annotations

import json

from moe.engine.memory.plan import main

# Mixtral layout: 3 layers, 4 experts of 3 x 64 x 96 weights each
CONFIG = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 64,
          "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 3,
          "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 512, "max_position_embeddings": 1024,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}


def test_plan_with_expert_cache(tmp_path, capsys):
    path = str(tmp_path / "config.json")
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    common = [path, "--device-memory", "2GiB", "--dtype", "fp32", "--json"]
    assert main(common) == 0
    resident = json.loads(capsys.readouterr().out)
    assert main(common + ["--expert-cache", "2"]) == 0
    offloaded = json.loads(capsys.readouterr().out)
    expert_bytes = 3 * 64 * 96 * 4
    assert resident["weights"] - offloaded["weights"] == 3 * (4 - 2) * expert_bytes
    assert offloaded["kv_cache"] - resident["kv_cache"] == 3 * (4 - 2) * expert_bytes
    assert offloaded["expert_cache_slow_tier_bytes"] == 3 * 4 * expert_bytes
    assert main(common + ["--expert-cache", f"{3 * 3 * expert_bytes}B"]) == 0  # a byte budget: 3 slots
    assert json.loads(capsys.readouterr().out)["expert_cache_experts_per_layer"] == 3
    assert main(common + ["--expert-cache", "1"]) == 2
    assert "expert_cache.experts_per_layer=1 is below router.top_k=2" in capsys.readouterr().err


def test_plan_counts_gpt_oss_expert_biases(tmp_path, capsys):
    # GPT-OSS (4 experts of 3 x 32 x 16 weights, a 2 x 16 gate/up bias and a 32 down bias; 3 layers)
    from tests.hf_fixtures import hf_config
    hf_config("gpt_oss-gqa-alternating").to_json_file(str(tmp_path / "config.json"))
    assert main([str(tmp_path / "config.json"), "--device-memory", "2GiB", "--dtype", "fp32", "--json",
                 "--expert-cache", "2"]) == 0
    facts = json.loads(capsys.readouterr().out)
    expert_bytes = (3 * 32 * 16 + 2 * 16 + 32) * 4
    assert facts["expert_cache_slow_tier_bytes"] == 3 * 4 * expert_bytes
    assert facts["expert_cache_fast_tier_bytes"] == 3 * 2 * expert_bytes
