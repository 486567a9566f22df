"""The families' config mapping (`moe/hf/families/`): an HF config maps to ours and back to
itself, Qwen's dense-layer layout round-trips, and options a family cannot express are refused by name."""

from __future__ import annotations

import re

import pytest

from moe.errors import ConfigError
from moe.hf.convert import hf_config, infer_family, model_config_from_hf
from moe.hf.families.base import dense_ids_of, dense_layout
from tests.hf_fixtures import CASES, hf_config as case_config

@pytest.mark.parametrize("case", list(CASES))
def test_config_maps_back_to_the_same_hf_config(case):
    hf = case_config(case)
    ours = model_config_from_hf(hf)
    again = hf_config(ours, hf.model_type, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    skip = {"transformers_version", "architectures", "_name_or_path", "dtype", "attn_implementation"}
    a = {k: v for k, v in hf.to_dict().items() if k not in skip}
    b = {k: v for k, v in again.to_dict().items() if k not in skip}
    if a.get("head_dim") == hf.hidden_size // hf.num_attention_heads:
        del a["head_dim"]  # the default, written out: not derived from our config (an import keeps it as given)
    assert a == b
    assert infer_family(ours) == hf.model_type or hf.model_type == "mixtral"

@pytest.mark.parametrize("dense, n", [([], 4), ([0, 2], 4), ([0, 1, 2, 4], 6), ([3], 5), ([0, 1, 2], 3)])
def test_dense_layout_round_trips(dense, n):
    step, mlp_only = dense_layout(dense, n)
    assert dense_ids_of(step, mlp_only, n) == sorted(dense)
    if dense == [0, 2]:
        assert (step, mlp_only) == (2, [])  # Qwen's own description: a sparse step of 2

@pytest.mark.parametrize("model_type, change, match", [
    ("olmoe", dict(qk_norm="head"), "model.qk_norm='head' cannot be expressed as a OLMoE model"),
    ("olmoe", dict(qkv_bias=True), "model.qkv_bias=True cannot be expressed as a OLMoE model"),
    ("qwen3_moe", dict(clip_qkv=1.0), "model.clip_qkv=1.0 cannot be expressed as a Qwen3-MoE model"),
    ("qwen3_moe", dict(n_shared_experts=1, shared_expert_gate=True), "model.n_shared_experts=1"),
    ("qwen2_moe", dict(shared_expert_gate=False), "model.shared_expert_gate=False"),
    ("qwen2_moe", dict(attn_out_bias=True), "model.attn_out_bias=True"),
    ("mixtral", dict(dense_layers=[1]), "model.dense_layers=[1]"),
])
def test_options_a_family_cannot_express_are_refused(model_type, change, match):
    import dataclasses

    case = {"olmoe": "olmoe-tied-renorm", "qwen3_moe": "qwen3-headdim-mlponly", "qwen2_moe": "qwen2-step2-headdim",
            "mixtral": "mixtral-gqa-headdim"}[model_type]
    ours = dataclasses.replace(model_config_from_hf(case_config(case)), **change)
    with pytest.raises(ConfigError, match=re.escape(match)):
        hf_config(ours, model_type)


# The config.json files of the published checkpoints (as on the hub), and their documented sizes.


# ------------------------------------------------------------------ rope scaling (moe/rope.py)

ROPE_CASES = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 16.0},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32},
}


@pytest.mark.parametrize("case, rope", [("qwen3-headdim-mlponly", "yarn"), ("mixtral-gqa-headdim", "llama3"),
                                        ("olmoe-tied-renorm", "linear"), ("qwen2-step2-headdim", "dynamic")])
def test_rope_scaling_maps_both_ways_and_matches_hf_logits(case, rope):
    """An HF config with rope_parameters of each type maps to our rope_scaling and back to itself,
    and HF's model and ours give the same logits past the original context (dynamic: at a batch
    that reaches the extended context, where HF's per-batch frequencies equal our fixed ones)."""
    import torch
    from transformers import AutoModelForCausalLM

    from moe.hf.convert import from_hf_model
    from tests.hf_fixtures import randomize_

    hf = case_config(case)
    hf.rope_parameters = {**ROPE_CASES[rope], "rope_theta": hf.rope_parameters["rope_theta"]}
    ours = model_config_from_hf(hf)
    assert ours.rope_scaling == ROPE_CASES[rope]
    again = hf_config(ours, hf.model_type, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    assert again.rope_parameters == hf.rope_parameters
    assert model_config_from_hf(again) == ours
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf)
    randomize_(model, 3)
    model.eval()
    mine = from_hf_model(model, attention="eager", experts="loop")
    T = ours.max_context if rope == "dynamic" else 60  # 60 > original 32 (yarn, llama3) and > 128 / 2 (linear)
    ids = torch.randint(0, hf.vocab_size, (1, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, mine(ids).logits
    assert (a - b).abs().max().item() < 1e-4
