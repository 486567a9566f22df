"""HF directories of each family (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE) through `load_model(dir)`
(`moe/hf/io.py`): fp32 logits equal HF's (max abs diff <= 1e-4) on random inputs of odd lengths,
the engine's greedy continuation equals HF `generate()` token for token, bf16 / fp16 weights load
as stored, published configs convert to models of the published size, and config fields the
converter cannot honour or does not know are refused, naming them."""

from __future__ import annotations

import json

import pytest
import torch

from moe.errors import CheckpointError, ConfigError
from moe.hf.convert import model_config_from_hf
from moe.loading import load_model
from tests.hf_fixtures import CASES, hf_config as case_config, random_hf_model, random_ids

ATOL = 1e-4

@pytest.mark.parametrize("case", list(CASES))
def test_hf_directory_loads_with_hf_logits(case, hf_dirs):
    directory, hf = hf_dirs(case)
    assert len(list(directory.glob("model-*-of-*.safetensors"))) > 1  # the sharded path is what runs
    model, tok, cfg = load_model(directory)
    assert type(tok).__name__ == "HFTokenizer" and not model.training
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert (model.lm_head.weight is model.embed.weight) == bool(hf.config.tie_word_embeddings)
    for length, seed in ((13, 1), (7, 2)):
        ids = random_ids(2, length, seed)
        with torch.no_grad():
            expected, got = hf(input_ids=ids).logits, model(ids).logits
        assert expected.std() > 0.5  # the comparison is not between near-zero logits
        assert (got - expected).abs().max().item() <= ATOL

@pytest.mark.parametrize("case", ["mixtral-gqa-headdim", "olmoe-gqa1-bias-clip", "qwen2-step2-headdim",
                                  "qwen3-gqa1-bias-step2-tied", "deepseek_v2-lite-yarn",
                                  "deepseek_v3-sigmoid-bias-groups"])
def test_engine_greedy_equals_hf_generate(case, hf_dirs):
    from moe.engine import LLM, SamplingParams

    directory, hf = hf_dirs(case)
    prompts = [random_ids(1, 9, 3)[0].tolist(), random_ids(1, 5, 4)[0].tolist()]
    llm = LLM(str(directory), device="cpu", dtype="fp32", block_size=4, num_blocks=64)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ids = torch.tensor([prompt])  # (an explicit mask: HF would mask prompt tokens equal to pad_token_id)
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
        assert out.token_ids == ref[0, len(prompt):].tolist()

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_checkpoints_load_as_stored_or_cast(dtype, tmp_path):
    from moe.hf.convert import to_hf_state_dict

    hf = random_hf_model("qwen3-gqa1-bias-step2-tied", seed=3).to(dtype)
    hf.save_pretrained(str(tmp_path), max_shard_size="20KB")
    model, _, _ = load_model(tmp_path)  # the stored dtype (config.json says it)
    assert {p.dtype for p in model.parameters()} == {dtype}
    ours, theirs = to_hf_state_dict(model, "qwen3_moe"), hf.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    upcast, _, _ = load_model(tmp_path, dtype="fp32")
    assert {p.dtype for p in upcast.parameters()} == {torch.float32}
    assert torch.equal(upcast.embed.weight, theirs["model.embed_tokens.weight"].float())

@pytest.mark.parametrize("case, field, value, match", [
    ("qwen3-headdim-mlponly", "use_sliding_window", True, "use_sliding_window=True"),
    ("qwen2-window", "sliding_window", 0, r"layer_types has sliding_attention layers but sliding_window=0"),
    ("olmoe-gqa1-bias-clip", "head_dim", 16, "head_dim=16"),
    ("gpt_oss-gqa-alternating", "quantization_config", {"quant_method": "fp8"}, "quantization_config.quant_method"),
    ("qwen3-headdim-mlponly", "hidden_act", "gelu", "hidden_act='gelu'"),
    ("olmoe-tied-renorm", "rope_parameters", {"rope_type": "default", "rope_theta": 500.0,
                                              "partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
    ("qwen3-headdim-mlponly", "quantization_config", {"quant_method": "fp8"}, r"\['quantization_config'\]"),
    ("mixtral-mha-tied", "some_new_field", 3, r"\['some_new_field'\]"),
])
def test_unsupported_or_unknown_hf_fields_are_refused(case, field, value, match, tmp_path):
    raw = case_config(case).to_dict()
    raw[field] = value
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=match):
        load_model(tmp_path)

def test_an_unconverted_family_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    with pytest.raises(CheckpointError, match="holds a 'llama' model; moe-lab converts the families "
                                              r"\['deepseek_v2', 'deepseek_v3', 'gpt_oss', 'mixtral', 'olmoe', 'qwen2_moe', 'qwen3_moe'\]"):
        load_model(tmp_path)

PUBLISHED = {
    "OLMoE-1B-7B-0924": ({"architectures": ["OlmoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                          "clip_qkv": None, "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048,
                          "initializer_range": 0.02, "intermediate_size": 1024, "max_position_embeddings": 4096,
                          "model_type": "olmoe", "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 64,
                          "num_experts_per_tok": 8, "num_hidden_layers": 16, "num_key_value_heads": 16,
                          "output_router_logits": False, "pad_token_id": 1, "rms_norm_eps": 1e-05,
                          "rope_scaling": None, "rope_theta": 10000.0, "router_aux_loss_coef": 0.01,
                          "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.0.dev0",
                          "use_cache": True, "vocab_size": 50304}, 6.92e9, 1.28e9),
    "Qwen3-30B-A3B": ({"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                       "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
                       "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
                       "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
                       "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
                       "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
                       "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False,
                       "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
                       "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False,
                       "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
                       "use_sliding_window": False, "vocab_size": 151936}, 30.5e9, 3.3e9),
    "Qwen1.5-MoE-A2.7B": ({"architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
                           "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
                           "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
                           "model_type": "qwen2_moe", "num_attention_heads": 16, "num_hidden_layers": 24,
                           "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                           "sliding_window": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                           "transformers_version": "4.36.0.dev0", "use_cache": True, "use_sliding_window": False,
                           "vocab_size": 151936, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
                           "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60,
                           "norm_topk_prob": False, "output_router_logits": False, "router_aux_loss_coef": 0.001},
                          14.3e9, 2.7e9),
    "Mixtral-8x7B-v0.1": ({"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
                           "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
                           "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
                           "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
                           "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
                           "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
                           "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                           "transformers_version": "4.36.0.dev0", "use_cache": True, "vocab_size": 32000},
                          46.7e9, 12.9e9),
}

@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_configs_convert_to_models_of_the_published_size(name, tmp_path):
    """Each published config.json is accepted field by field, and our model of it (built on the meta
    device: no memory) has the documented total and active parameter counts (within 2%)."""
    from moe.hf.io import read_hf_config
    from moe.model import Transformer

    raw, total, active = PUBLISHED[name]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = model_config_from_hf(read_hf_config(tmp_path))
    with torch.device("meta"):
        model = Transformer(cfg)
    assert model.num_params() == pytest.approx(total, rel=0.02)
    assert model.num_params(active=True) == pytest.approx(active, rel=0.02)
    expected = {"OLMoE-1B-7B-0924": ("full", False, 0), "Qwen3-30B-A3B": ("head", True, 0),
                "Qwen1.5-MoE-A2.7B": ("none", False, 5632), "Mixtral-8x7B-v0.1": ("none", True, 0)}[name]
    assert (cfg.qk_norm, cfg.router.renormalize, cfg.resolved_shared_hidden) == expected
