"""Added for the sixth mutation run (mutF, docs/results/mutation/run6_mutF/): the families' shared
config mapping (`moe/hf/families/base.py`) checked on configs only, no model built, so each case
takes milliseconds. No fixtures: the run's driver calls these functions directly."""

from __future__ import annotations

import dataclasses
import re

import pytest

from moe.errors import ConfigError
from moe.hf.convert import hf_config, model_config_from_hf
from moe.hf.families.base import (FAMILIES, common_hf_fields, dense_ids_of, dense_layout, hf_head_dim, hf_layer_fields, layer_fields,
                                  rope_fields)
from tests.hf_fixtures import CASES, hf_config as case_config

SKIP = {"transformers_version", "architectures", "_name_or_path", "dtype", "attn_implementation"}


@pytest.mark.parametrize("case", list(CASES))
def test_every_case_maps_to_ours_and_back_to_itself(case):
    hf = case_config(case)
    ours = model_config_from_hf(hf)
    again = hf_config(ours, hf.model_type, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    a = {k: v for k, v in hf.to_dict().items() if k not in SKIP}
    b = {k: v for k, v in again.to_dict().items() if k not in SKIP}
    if a.get("head_dim") == hf.hidden_size // hf.num_attention_heads:
        del a["head_dim"]
    assert a == b
    assert again.architectures == [FAMILIES.get(hf.model_type).architecture]
    assert ours.vocab_size == hf.vocab_size and ours.d_model == hf.hidden_size
    assert ours.n_layers == hf.num_hidden_layers and ours.n_heads == hf.num_attention_heads
    assert ours.max_seq_len == hf.max_position_embeddings and ours.norm_eps == hf.rms_norm_eps
    assert ours.init_std == hf.initializer_range and ours.tie_embeddings == bool(hf.tie_word_embeddings)
    if not hf.model_type.startswith("deepseek"):  # MLA: its own head dims
        assert ours.resolved_head_dim == hf_head_dim(hf)


@pytest.mark.parametrize("dense, n, want", [([], 4, (1, [])), ([0, 2], 4, (2, [])), ([0, 1, 2, 4], 6, (2, [1])),
                                            ([3], 5, (1, [3])), ([0, 1, 2], 3, (2, [1])), ([0, 1, 3, 4], 6, (3, [])),
                                            ([0, 1, 2, 3, 4], 6, (6, []))])
def test_dense_layout_exact(dense, n, want):
    assert dense_layout(dense, n) == want
    assert dense_ids_of(*want, n) == sorted(dense)


def _ours(case="olmoe-tied-renorm"):
    return model_config_from_hf(case_config(case))


def _refused(ours, model_type, text):
    with pytest.raises(ConfigError) as e:
        hf_config(ours, model_type)
    assert str(e.value) == text, str(e.value)


def test_router_refusals_name_the_option():
    m = _ours()
    r = m.router
    fam = "OLMoE"
    _refused(dataclasses.replace(m, router=dataclasses.replace(r, temperature=2.0)), "olmoe",
             f"router.temperature=2.0 cannot be expressed as a {fam} model: HF's router has no temperature")
    _refused(dataclasses.replace(m, router=dataclasses.replace(r, capacity_factor=1.5)), "olmoe",
             f"router.capacity_factor=1.5 cannot be expressed as a {fam} model: HF is dropless, so inference "
             "would differ from ours")
    _refused(dataclasses.replace(m, router=dataclasses.replace(r, drop_experts=(1,))), "olmoe",
             f"router.drop_experts=[1] cannot be expressed as a {fam} model: an inference-time ablation HF "
             "configs cannot state")
    _refused(dataclasses.replace(m, mtp_depth=1), "olmoe",
             f"model.mtp_depth=1 cannot be expressed as a {fam} model: the family has no multi-token-prediction "
             "layers, and dropping trained ones silently would lose the model's own drafter (moe/mtp.py)")
    _refused(dataclasses.replace(m, routed_scaling_factor=2.0), "olmoe",
             f"model.routed_scaling_factor=2.0 cannot be expressed as a {fam} model: it does not scale its "
             "routed experts")



def test_feature_refusals_name_the_option():
    m = _ours()
    _refused(dataclasses.replace(m, attention_sinks=True), "olmoe",
             "model.attention_sinks=True cannot be expressed as a OLMoE model: OLMoE has no attention sinks")
    _refused(dataclasses.replace(m, router_bias=True), "olmoe",
             "model.router_bias=True cannot be expressed as a OLMoE model: OLMoE's router has no bias")
    _refused(dataclasses.replace(m, expert_bias=True), "olmoe",
             "model.expert_bias=True cannot be expressed as a OLMoE model: OLMoE's experts have no biases")
    _refused(dataclasses.replace(m, expert_activation="gpt_oss"), "olmoe",
             "model.expert_activation='gpt_oss' cannot be expressed as a OLMoE model: OLMoE's experts are "
             "plain SwiGLU")
    _refused(dataclasses.replace(m, sliding_window=4), "olmoe",
             "model.sliding_window=4 cannot be expressed as a OLMoE model: OLMoE attention is full causal attention")
    mx = _ours("mixtral-window")
    types = ["full"] + ["sliding"] * (mx.n_layers - 1)
    _refused(dataclasses.replace(mx, layer_types=types), "mixtral",
             f"model.layer_types={types!r} cannot be expressed as a Mixtral model: Mixtral's sliding_window "
             "applies to every layer alike")
    # a uniform window is expressible by Mixtral, not by OLMoE
    assert hf_config(mx, "mixtral").sliding_window == mx.sliding_window


def test_input_refusals_and_unknown_fields():
    hf = case_config("olmoe-tied-renorm")
    hf.hidden_act = "gelu"
    with pytest.raises(ConfigError, match=re.escape("OlmoeConfig.hidden_act='gelu' is not supported: our experts "
                                                    "and dense FFNs are SwiGLU (silu)")):
        model_config_from_hf(hf)
    hf = case_config("olmoe-tied-renorm")
    hf.attention_dropout = 0.1
    with pytest.raises(ConfigError, match=re.escape("OlmoeConfig.attention_dropout=0.1 is not supported: our "
                                                    "attention has no dropout")):
        model_config_from_hf(hf)
    hf = case_config("olmoe-tied-renorm")
    hf.brand_new_field = 3
    with pytest.raises(ConfigError) as e:
        model_config_from_hf(hf)
    assert str(e.value) == ("OlmoeConfig field(s) ['brand_new_field'] are not known to the olmoe converter, which "
                            "refuses rather than ignores what may change the model's outputs")
    hf = case_config("olmoe-tied-renorm")
    hf.use_cache = False
    hf.output_router_logits = True
    assert model_config_from_hf(hf) == model_config_from_hf(case_config("olmoe-tied-renorm"))


def test_hf_config_base_extra_and_vocab():
    m = _ours()
    with pytest.raises(ConfigError, match=re.escape("model.vocab_size=None: set it (the tokenizer's size) before "
                                                    "converting")):
        hf_config(dataclasses.replace(m, vocab_size=None), "olmoe")
    with pytest.raises(ConfigError) as e:
        hf_config(m, "olmoe", hidden_size=8, vocab_size=3)
    assert str(e.value) == ("extra HF config option(s) ['hidden_size', 'vocab_size'] are derived from the model "
                            "config; change the ModelConfig/RouterConfig instead")
    fam = FAMILIES.get("olmoe")()
    c = fam.hf_config(m)
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (None, None, None)
    c = fam.hf_config(m, base={"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3, "hidden_size": 999,
                               "output_attentions": True})
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id, c.hidden_size) == (1, 2, 3, m.d_model)
    assert c.output_attentions is False
    c = fam.hf_config(m, base={"bos_token_id": 1}, bos_token_id=7)
    assert c.bos_token_id == 7 and c.architectures == ["OlmoeForCausalLM"]
    assert c.hidden_act == "silu" and c.attention_dropout == 0.0 and c.num_experts_per_tok == m.router.top_k
    assert c.router_aux_loss_coef == m.router.aux_loss_coef and c.num_key_value_heads == m.n_kv_heads
    assert "head_dim" not in c.to_dict() or c.head_dim == m.d_model // m.n_heads
    scaled = dataclasses.replace(m, rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert common_hf_fields(scaled, "when_different")["head_dim"] == m.d_model // m.n_heads  # scaled: written
    assert "head_dim" not in common_hf_fields(scaled, "never") and "head_dim" not in common_hf_fields(m, "when_different")
    assert common_hf_fields(dataclasses.replace(m, head_dim=4), "when_different")["head_dim"] == 4


class _C:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_rope_fields():
    assert rope_fields(_C(rope_parameters={"rope_type": "default", "rope_theta": 5})) == dict(
        rope_theta=5.0, rope_scaling=None)
    assert rope_fields(_C(rope_parameters={"type": "linear", "factor": 2.0, "rope_theta": 7})) == dict(
        rope_theta=7.0, rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert rope_fields(_C(rope_parameters={"partial_rotary_factor": 1.0}, rope_theta=3)) == dict(
        rope_theta=3.0, rope_scaling=None)
    assert rope_fields(_C(rope_parameters=None, rope_theta=3)) == dict(rope_theta=3.0, rope_scaling=None)
    for params, msg in [
        ({"rope_theta": 1, "partial_rotary_factor": 0.5}, "rope_parameters.partial_rotary_factor=0.5 is not "
         "supported: our rotary covers the whole head dim"),
        ({}, "rope_parameters.rope_theta is missing"),
        ({"rope_theta": 1, "factor": 2.0}, "rope_parameters keys ['factor'] are not supported with rope_type='default'"),
        ({"rope_theta": 1, "rope_type": "ntk"}, "rope_parameters.rope_type='ntk' is not supported; moe-lab's rotary "
         "implements ['default', "),
        ({"rope_theta": 1, "rope_type": "linear"}, "rope_parameters: "),
    ]:
        with pytest.raises(ConfigError) as e:
            rope_fields(_C(rope_parameters=params))
        assert str(e.value).startswith(msg), str(e.value)
    assert rope_fields(_C(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1,
                                           "partial_rotary_factor": None}))["rope_scaling"] == {
        "rope_type": "linear", "factor": 2.0}


def test_layer_fields():
    assert layer_fields(_C(layer_types=["full_attention"] * 2, sliding_window=4)) == dict(
        layer_types=None, sliding_window=None)
    assert layer_fields(_C(layer_types=["sliding_attention", "full_attention"], sliding_window=4.0)) == dict(
        layer_types=["sliding", "full"], sliding_window=4)
    with pytest.raises(ConfigError) as e:
        layer_fields(_C(layer_types=["sliding_attention"], sliding_window=0))
    assert str(e.value) == "_C.layer_types has sliding_attention layers but sliding_window=0"
    m = _ours()
    assert hf_layer_fields(m) == dict(layer_types=["full_attention"] * m.n_layers, sliding_window=None,
                                      use_sliding_window=False)
    m = dataclasses.replace(m, sliding_window=3, layer_types=["sliding"] + ["full"] * (m.n_layers - 1))
    assert hf_layer_fields(m) == dict(layer_types=["sliding_attention"] + ["full_attention"] * (m.n_layers - 1),
                                      sliding_window=3, use_sliding_window=True)


def test_family_defaults():
    fam = FAMILIES.get("olmoe")()
    assert fam.stored_mtp_depth(None, {"x"}) == 0 and fam.kept_quantization(None, None) is False
    assert fam.stored_pieces([1]) == [1] and fam.kept_route("r") == "r" and fam.tensor_transform("a.b") is None
    assert fam.kept_tensors({}, "a", "b") is None


def test_common_refusals_list():
    from moe.hf.families.base import common_refusals

    m = _ours()
    assert common_refusals(m) == [
        (False, "router.name", "topk", "HF routes with softmax top-k ('topk')"),
        (False, "router.score_func", None, "HF scores experts with a softmax"),
        (False, "router.temperature", 1.0, "HF's router has no temperature"),
        (False, "router.n_groups", 1, "HF has no group-limited routing"),
        (False, "router.capacity_factor", None, "HF is dropless, so inference would differ from ours"),
        (False, "router.drop_experts", [], "an inference-time ablation HF configs cannot state"),
        (False, "model.mtp_depth", 0, "the family has no multi-token-prediction layers, and dropping trained ones "
         "silently would lose the model's own drafter (moe/mtp.py)"),
        (False, "model.attention_kind", "mha",
         "its attention is grouped-query attention (MLA: the deepseek_v2 / deepseek_v3 families)"),
        (False, "model.routed_scaling_factor", 1.0, "it does not scale its routed experts"),
    ]
    ds = _ours("deepseek_v3-sigmoid-bias-groups")
    got = {opt: (refused, value) for refused, opt, value, _ in common_refusals(ds)}
    assert got["router.name"] == (True, ds.router.name)
    assert got["router.score_func"] == (True, "sigmoid")
    assert got["router.n_groups"] == (True, ds.router.n_groups) and ds.router.n_groups > 1
    m2 = dataclasses.replace(m, router=dataclasses.replace(m.router, n_groups=1))
    assert common_refusals(m2)[3][0] is False


def test_feature_refusals_list():
    fam = FAMILIES.get("olmoe")()
    m = _ours()
    assert fam.feature_refusals(m) == [
        (False, "model.sliding_window", None, "OLMoE attention is full causal attention"),
        (False, "model.layer_types", None, "OLMoE's sliding_window applies to every layer alike"),
        (False, "model.attention_sinks", False, "OLMoE has no attention sinks"),
        (False, "model.router_bias", False, "OLMoE's router has no bias"),
        (False, "model.expert_bias", False, "OLMoE's experts have no biases"),
        (False, "model.expert_activation", "swiglu", "OLMoE's experts are plain SwiGLU"),
    ]


def test_model_config_defaults_and_router():
    from moe.config import AttentionConfig, ExpertsConfig

    fam = FAMILIES.get("olmoe")()
    hf = case_config("olmoe-tied-renorm")
    m = fam.model_config(hf)
    assert m.attention == AttentionConfig(name="sdpa") and m.experts == ExpertsConfig(name="sorted")
    m = fam.model_config(hf, attention="eager", experts="loop")
    assert m.attention.name == "eager" and m.experts.name == "loop"
    r = m.router
    assert (r.name, r.top_k, r.z_loss_coef, r.temperature, r.jitter, r.capacity_factor) == (
        "topk", hf.num_experts_per_tok, 0.0, 1.0, 0.0, None)
    assert r.aux_loss_coef == hf.router_aux_loss_coef


def test_hf_config_messages_and_base_fields():
    m = _ours()
    fam = FAMILIES.get("olmoe")()
    with pytest.raises(ConfigError) as e:
        fam.hf_config(dataclasses.replace(m, vocab_size=None))
    assert str(e.value) == "model.vocab_size=None: set it (the tokenizer's size) before converting"
    c = fam.hf_config(m, base={"use_cache": False, "num_local_experts": 99})
    assert c.use_cache is False and c.num_experts == m.n_experts
    for tok in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(fam.hf_config(m, base={tok: 5}), tok) == 5
    q = _ours("qwen3-headdim-mlponly")
    qf = FAMILIES.get("qwen3_moe")()
    alias = qf.config_class.attribute_map["num_experts"]
    with pytest.raises(ConfigError, match=re.escape(f"['{alias}'] are derived")):
        qf.hf_config(q, **{alias: 9})


def test_rope_partial_and_head_dim_arithmetic():
    for partial in (2, 2.0, 0.5):
        with pytest.raises(ConfigError, match="partial_rotary_factor"):
            rope_fields(_C(rope_parameters={"rope_theta": 1, "partial_rotary_factor": partial}))
    for partial in (1, 1.0, None):
        assert rope_fields(_C(rope_parameters={"rope_theta": 1, "partial_rotary_factor": partial}))["rope_theta"] == 1.0
    assert hf_head_dim(_C(hidden_size=30, num_attention_heads=4)) == 7
    assert hf_head_dim(_C(hidden_size=30, num_attention_heads=4, head_dim=None)) == 7
    assert hf_head_dim(_C(hidden_size=30, num_attention_heads=4, head_dim=9)) == 9


def test_common_model_fields_dict():
    from moe.hf.families.base import common_model_fields

    kw = dict(vocab_size=11, hidden_size=30, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=None,
              max_position_embeddings=17, rope_parameters={"rope_theta": 5}, rms_norm_eps=1e-3,
              tie_word_embeddings=1, initializer_range=0.123)
    assert common_model_fields(_C(**kw)) == dict(
        vocab_size=11, d_model=30, n_layers=3, n_heads=4, n_kv_heads=4, head_dim=None, max_seq_len=17,
        rope_theta=5.0, rope_scaling=None, norm_eps=1e-3, tie_embeddings=True, init_std=0.123)
    assert common_model_fields(_C(**{**kw, "head_dim": 8, "num_key_value_heads": 2}))["head_dim"] == 8
    assert common_model_fields(_C(**{**kw, "head_dim": 7}))["head_dim"] is None


def test_common_hf_fields_dict():
    m = dataclasses.replace(_ours(), init_std=0.123, norm_eps=1e-3)
    m = dataclasses.replace(m, router=dataclasses.replace(m.router, aux_loss_coef=0.5))
    assert common_hf_fields(m, "when_different") == dict(
        vocab_size=m.vocab_size, hidden_size=m.d_model, num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads,
        num_key_value_heads=m.n_kv_heads, max_position_embeddings=m.max_seq_len,
        rope_parameters={"rope_type": "default", "rope_theta": float(m.rope_theta)}, rms_norm_eps=1e-3,
        tie_word_embeddings=m.tie_embeddings, initializer_range=0.123, num_experts_per_tok=m.router.top_k,
        router_aux_loss_coef=0.5, hidden_act="silu", attention_dropout=0.0)
    odd = dataclasses.replace(m, d_model=30, n_heads=4, head_dim=7)  # not validated: the arithmetic alone
    assert "head_dim" not in common_hf_fields(odd, "when_different")


def test_hf_layer_fields_unused_window():
    m = _ours()
    m = dataclasses.replace(m, sliding_window=3, layer_types=["full"] * m.n_layers)
    assert hf_layer_fields(m) == dict(layer_types=["full_attention"] * m.n_layers, sliding_window=None,
                                      use_sliding_window=False)


def test_two_groups_are_refused():
    from moe.hf.families.base import common_refusals

    m = _ours()
    m = dataclasses.replace(m, router=dataclasses.replace(m.router, n_groups=2))
    assert common_refusals(m)[3] == (True, "router.n_groups", 2, "HF has no group-limited routing")


# ------------------------------------------------------------------ GPT-OSS (moe/hf/families/gpt_oss.py)

def test_gpt_oss_refusal_lists():
    fam = FAMILIES.get("gpt_oss")()
    m = _ours("gpt_oss-gqa-alternating")
    assert fam.feature_refusals(m) == [
        (False, "model.attention_sinks", True, "every GPT-OSS attention has sinks"),
        (False, "model.router_bias", True, "GPT-OSS's router has a bias"),
        (False, "model.expert_bias", True, "GPT-OSS's experts have biases"),
        (False, "model.expert_activation", "clamped_swiglu", "GPT-OSS's experts use the clamped SwiGLU"),
    ]
    assert fam.refusals(m) == [
        (False, "model.n_shared_experts", 0, "GPT-OSS has no shared experts"),
        (False, "model.dense_layers", [], "every GPT-OSS layer is an MoE layer"),
        (False, "model.qk_norm", "none", "GPT-OSS has no qk-norm"),
        (False, "model.clip_qkv", None, "GPT-OSS does not clip q/k/v"),
        (False, "model.qkv_bias", m.qkv_bias, "GPT-OSS's attention_bias puts biases on all four projections or "
         f"none (model.attn_out_bias={m.attn_out_bias})"),
        (False, "router.renormalize", True, "GPT-OSS's softmax runs over the top-k logits (renormalised)"),
    ]
    bad = dataclasses.replace(m, attention_sinks=False, router_bias=False, expert_bias=False, expert_activation="swiglu",
                              n_shared_experts=1, dense_layers=[0], qk_norm="head", clip_qkv=1.0,
                              qkv_bias=not m.attn_out_bias, router=dataclasses.replace(m.router, renormalize=False))
    assert [r[0] for r in fam.feature_refusals(bad)] == [True] * 4
    assert [r[0] for r in fam.refusals(bad)] == [True] * 6


def test_gpt_oss_input_refusals():
    fam = FAMILIES.get("gpt_oss")()
    hf = case_config("gpt_oss-gqa-alternating")
    orig = hf.rope_parameters.get("original_max_position_embeddings") if hf.rope_parameters else None
    assert fam.input_refusals(hf) == [
        (False, "quantization_config.quant_method", None,
         "only MXFP4 experts are read (dequantised at load, or kept with quantization='mxfp4')"),
        (False, "layer_types", hf.layer_types, "layer kinds [] are not full or sliding attention"),
        (False, "experts_per_token", getattr(hf, "experts_per_token", None),
         f"it differs from num_experts_per_tok={hf.num_experts_per_tok}"),
        (False, "initial_context_length", getattr(hf, "initial_context_length", None),
         f"it differs from the rotary's original_max_position_embeddings={orig}"),
    ]
    hf.quantization_config = {"quant_method": "awq"}
    hf.layer_types = ["chunked_attention"] + hf.layer_types[1:]
    hf.experts_per_token = hf.num_experts_per_tok + 1
    hf.initial_context_length = 12345
    got = fam.input_refusals(hf)
    assert [r[0] for r in got] == [True] * 4
    assert got[0][2] == "awq" and got[1][3] == "layer kinds ['chunked_attention'] are not full or sliding attention"
    hf.quantization_config = {"quant_method": "mxfp4"}
    hf.experts_per_token = hf.num_experts_per_tok
    hf.initial_context_length = orig
    assert [r[0] for r in fam.input_refusals(hf)] == [False, True, False, False]
    y = case_config("gpt_oss-mha-yarn-tied")
    n = y.rope_parameters["original_max_position_embeddings"]
    y.initial_context_length = n
    assert fam.input_refusals(y)[3][0] is False
    y.initial_context_length = n + 1
    assert fam.input_refusals(y)[3] == (True, "initial_context_length", n + 1,
                                        f"it differs from the rotary's original_max_position_embeddings={n}")


# ------------------------------------------------------------------ DeepSeek-V2 (moe/hf/families/deepseek_v2.py)

def test_deepseek_v2_input_refusals():
    fam = FAMILIES.get("deepseek_v2")()
    hf = case_config("deepseek_v2-lite-yarn")
    want = [
        (False, "num_key_value_heads", hf.num_key_value_heads,
         "MLA gives every head its own key and value (num_key_value_heads = num_attention_heads)"),
        (False, "attention_bias", hf.attention_bias, "our MLA projections have no biases"),
        (False, "mlp_bias", getattr(hf, "mlp_bias", None), "our FFNs have no biases"),
        (False, "topk_method", hf.topk_method, "DeepSeek-V2 routes with ['greedy', 'group_limited_greedy']"),
        (False, "scoring_func", getattr(hf, "scoring_func", None), "transformers' DeepSeek-V2 scores experts with a softmax"),
        (False, "moe_layer_freq", getattr(hf, "moe_layer_freq", None),
         "transformers makes every layer from first_k_dense_replace on an MoE layer"),
        (False, "norm_topk_prob", hf.norm_topk_prob,
         "transformers' DeepSeek-V2 ignores it (never renormalises) while DeepSeek's code renormalises"),
    ]
    assert fam.input_refusals(hf) == want
    hf.num_key_value_heads = 1
    hf.attention_bias = True
    hf.mlp_bias = True
    hf.topk_method = "noaux_tc"
    hf.scoring_func = "sigmoid"
    hf.moe_layer_freq = 2
    hf.norm_topk_prob = True
    got = fam.input_refusals(hf)
    assert [r[0] for r in got] == [True] * 7
    assert [r[2] for r in got] == [1, True, True, "noaux_tc", "sigmoid", 2, True]
    hf = case_config("deepseek_v2-lite-yarn")
    hf.scoring_func, hf.moe_layer_freq, hf.topk_method = "softmax", 1, "group_limited_greedy"
    assert [r[0] for r in fam.input_refusals(hf)] == [False] * 7
    v3 = FAMILIES.get("deepseek_v3")()
    h3 = case_config("deepseek_v3-sigmoid-bias-groups")
    h3.norm_topk_prob = True
    assert v3.input_refusals(h3)[-1][0] is False


def test_deepseek_v2_output_refusals():
    fam = FAMILIES.get("deepseek_v2")()
    m = _ours("deepseek_v2-lite-yarn")
    r = m.router
    assert fam.router_refusals(m) == [
        (False, "router.name", "topk", "DeepSeek-V2 routes with a softmax top-k ('topk')"),
        (False, "router.renormalize", False, "transformers' DeepSeek-V2 never renormalises"),
        (False, "router.group_score_top", r.group_score_top, "DeepSeek-V2 scores a group by its best expert"),
        (False, "router.temperature", 1.0, "DeepSeek's router has no temperature"),
        (False, "router.capacity_factor", None, "DeepSeek is dropless, so inference would differ from ours"),
        (False, "router.drop_experts", [], "an inference-time ablation HF configs cannot state"),
        (False, "model.attention_kind", "mla", "DeepSeek's attention is MLA"),
    ]
    assert fam.refusals(m) == [
        (False, "model.dense_layers", m.dense_layer_ids, "DeepSeek's dense layers are the first first_k_dense_replace"),
        (False, "model.shared_expert_hidden", m.shared_expert_hidden,
         "DeepSeek's shared FFN is n_shared_experts x moe_intermediate_size wide"),
        (False, "model.shared_expert_gate", False, "DeepSeek has no shared gate"),
        (False, "model.rope_interleave", True, "DeepSeek-V2 always rotates interleaved pairs"),
        (False, "model.mtp_depth", 0, "DeepSeek-V2 has no multi-token-prediction layers (deepseek_v3 has)"),
    ]
    bad_r = dataclasses.replace(r, renormalize=True, temperature=2.0, capacity_factor=1.0, drop_experts=[0],
                                n_groups=2, group_score_top=2)
    assert [x[0] for x in fam.router_refusals(dataclasses.replace(m, router=bad_r))] == [False] + [True] * 5 + [False]
    one = dataclasses.replace(bad_r, n_groups=1)
    assert fam.router_refusals(dataclasses.replace(m, router=one))[2][0] is False
    assert fam.router_refusals(dataclasses.replace(m, router=dataclasses.replace(r, n_groups=2, group_score_top=1)))[2][0] is False
    bad = dataclasses.replace(m, shared_expert_hidden=m.n_shared_experts * m.expert_hidden + 1,
                              shared_expert_gate=True, rope_interleave=False, mtp_depth=1)
    assert [x[0] for x in fam.refusals(bad)] == [False] + [True] * 4
    ok = dataclasses.replace(m, shared_expert_hidden=m.n_shared_experts * m.expert_hidden)
    assert fam.refusals(ok)[1][0] is False
    v3 = FAMILIES.get("deepseek_v3")()
    assert [x[0] for x in v3.refusals(bad)][3:] == [False, False]


def test_deepseek_v2_router_and_fields():
    fam = FAMILIES.get("deepseek_v2")()
    for case in ("deepseek_v2-lite-yarn", "deepseek_v2-group-qlora"):
        hf = case_config(case)
        m = fam.model_config(hf)
        r = m.router
        grouped = hf.topk_method == "group_limited_greedy"
        assert (r.name, r.top_k, r.renormalize, r.z_loss_coef) == ("topk", hf.num_experts_per_tok, False, 0.0)
        assert (r.n_groups, r.topk_groups) == ((hf.n_group, hf.topk_group) if grouped else (1, 1))
        assert m.n_dense_layers == min(hf.first_k_dense_replace, hf.num_hidden_layers)
        assert m.routed_scaling_factor == float(hf.routed_scaling_factor) and m.attention_kind == "mla"
        assert m.n_shared_experts == (hf.n_shared_experts or 0) and m.n_kv_heads == hf.num_attention_heads
        f = fam.hf_fields(m)
        assert f["topk_method"] == hf.topk_method and f["norm_topk_prob"] is False and f["attention_bias"] is False
        assert (f["n_group"], f["topk_group"]) == ((hf.n_group, hf.topk_group) if grouped else (None, None))
        assert f["intermediate_size"] == hf.intermediate_size and f["first_k_dense_replace"] == hf.first_k_dense_replace
    m = dataclasses.replace(m, dense_hidden=None)
    assert fam.shared_hf_fields(m)["intermediate_size"] == m.expert_hidden * m.router.top_k


def test_deepseek_v2_fields_edges():
    fam = FAMILIES.get("deepseek_v2")()
    hf = case_config("deepseek_v2-lite-yarn")
    assert fam.model_config(hf).router.aux_loss_coef == 0.0  # DeepseekV2Config has no such field
    hf.router_aux_loss_coef = 0.3  # a remote-code config that carries it
    assert fam.model_config(hf).router.aux_loss_coef == 0.3
    hf.n_shared_experts = 0
    assert fam.model_fields(hf)["n_shared_experts"] == 0
    m = fam.model_config(case_config("deepseek_v2-lite-yarn"))
    two = dataclasses.replace(m, router=dataclasses.replace(m.router, n_groups=2, topk_groups=1))
    f = fam.hf_fields(two)
    assert (f["topk_method"], f["n_group"], f["topk_group"]) == ("group_limited_greedy", 2, 1)
    explicit = dataclasses.replace(m, n_dense_layers=0, dense_layers=[0, 1])
    assert fam.shared_hf_fields(explicit)["first_k_dense_replace"] == 2


def test_gpt_oss_helpers():
    from moe.hf.families.gpt_oss import _original_length, _quant_method

    assert _original_length(_C(rope_scaling={"original_max_position_embeddings": 7})) == 7
    assert _original_length(_C(rope_parameters=None, rope_scaling={"original_max_position_embeddings": 7})) == 7
    assert _original_length(_C(rope_parameters={"original_max_position_embeddings": 5})) == 5
    assert _original_length(_C()) is None
    assert _quant_method(_C(quantization_config=_C(quant_method="mxfp4"))) == "mxfp4"
    assert _quant_method(_C(quantization_config={"quant_method": "mxfp4"})) == "mxfp4"
    assert _quant_method(_C()) is None
    fam = FAMILIES.get("gpt_oss")()
    m = _ours("gpt_oss-gqa-alternating")
    assert fam.hf_fields(dataclasses.replace(m, head_dim=None))["head_dim"] == m.d_model // m.n_heads
    hf = case_config("gpt_oss-gqa-alternating")
    hf.experts_per_token = hf.num_experts_per_tok + 1
    assert fam.input_refusals(hf)[2][2] == hf.num_experts_per_tok + 1


def test_gpt_oss_kept_and_exported_quantization():
    from moe.hf.families.gpt_oss import MXFP4_CONFIG
    from moe.quant import QuantSpec

    fam = FAMILIES.get("gpt_oss")()
    mx, mx_all = QuantSpec("mxfp4"), QuantSpec("mxfp4", linear=True)
    stored = _C(quantization_config={"quant_method": "mxfp4"})
    assert fam.kept_quantization(stored, mx) is True
    assert fam.kept_quantization(stored, mx_all) is False and fam.kept_quantization(stored, None) is False
    assert fam.kept_quantization(stored, QuantSpec("int8")) is False
    assert fam.kept_quantization(_C(), mx) is False
    assert fam.kept_quantization(_C(quantization_config={"quant_method": "awq"}), mx) is False
    c = _C()
    fam.export_quantization(c, mx)
    assert c.quantization_config == MXFP4_CONFIG and c.quantization_config is not MXFP4_CONFIG
    own = {"quant_method": "mxfp4", "mine": 1}
    c = _C(quantization_config=own)
    fam.export_quantization(c, mx)
    assert c.quantization_config is own  # an imported MXFP4 config is kept as it came
    fam.export_quantization(c, None)
    assert not hasattr(c, "quantization_config")
    c = _C()
    fam.export_quantization(c, mx_all)
    assert not hasattr(c, "quantization_config")


def test_gpt_oss_pieces_and_transforms():
    from moe.hf.families.gpt_oss import TRANSFORMS

    fam = FAMILIES.get("gpt_oss")()
    pieces = [("model.norm.weight", lambda: None)]
    assert fam.stored_pieces(pieces, kept=True) is pieces
    out = fam.stored_pieces(pieces)
    assert out is not pieces and list(out) == pieces
    for name in TRANSFORMS:
        assert fam.tensor_transform(f"model.layers.3.mlp.{name}") is TRANSFORMS[name]
    assert fam.tensor_transform("model.layers.0.mlp.router.weight") is None
    assert fam.tensor_transform("model.layers.0.self_attn.experts.down_proj") is None
    assert fam.tensor_transform("model.layers.0.mlp.experts.other") is None


def test_gpt_oss_transform_lookup_and_kept_route():
    fam = FAMILIES.get("gpt_oss")()
    assert fam.tensor_transform("experts.down_proj") is None  # not a layer's MoE block
    assert fam.tensor_transform("model.mlp.layers.0.mlp.experts.down_proj") is None  # only the tail after the first .mlp.
    seen = []
    route = fam.kept_route(lambda name: (seen.append(name), ["x"])[1])
    assert route("model.layers.0.mlp.experts.down_proj") == ["x"] and seen == ["model.layers.0.mlp.experts.down_proj"]
    [p] = route("model.layers.0.mlp.experts.down_proj_scales")
    assert p.target == "layers.0.ffn.experts.down_scales"
