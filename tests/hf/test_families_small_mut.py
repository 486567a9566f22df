"""Added for the seventh mutation run (mutS, docs/results/mutation/run7_mutS/): the small families'
config mapping (`moe/hf/families/mixtral.py`, `qwen2_moe.py`, `qwen3_moe.py`, `olmoe.py`,
`deepseek_v3.py`) checked method by method on configs only, no model built: each refusal list
exactly (option, value and message), each refusal switched on alone, and the mapped fields both
ways. No fixtures: the run's driver calls these functions directly."""

from __future__ import annotations

import dataclasses

import pytest

from moe.hf.convert import model_config_from_hf
from moe.hf.families.base import FAMILIES, dense_ids_of, hf_head_dim, hf_layer_fields, layer_fields
from tests.hf_fixtures import hf_config as case_config


def _fam(model_type):
    return FAMILIES.get(model_type)()


def _ours(case):
    return model_config_from_hf(case_config(case))


def _flags(refusals):
    return [r[0] for r in refusals]


def _only(n, i):
    return [j == i for j in range(n)]


# ------------------------------------------------------------------ Mixtral (moe/hf/families/mixtral.py)

MIXTRAL_WHY = [
    (False, "model.n_shared_experts", 0, "Mixtral has no shared experts"),
    (False, "model.n_dense_layers", 0, "every Mixtral layer is an MoE layer"),
    (False, "model.dense_layers", [], "every Mixtral layer is an MoE layer"),
    (False, "model.qk_norm", "none", "Mixtral has no qk-norm"),
    (False, "model.qkv_bias", False, "Mixtral's projections have no biases"),
    (False, "model.attn_out_bias", False, "Mixtral's projections have no biases"),
    (False, "model.clip_qkv", None, "Mixtral does not clip q/k/v"),
    (False, "router.renormalize", True, "Mixtral always renormalises the top-k weights"),
]


def test_mixtral_input_refusals():
    fam = _fam("mixtral")
    c = case_config("mixtral-gqa-headdim")
    why = "HF jitters the experts' input too; our router.jitter only the router's"
    assert fam.input_refusals(c) == [(False, "router_jitter_noise", 0.0, why)]
    for v in (1.0, 0.5, -1.0):
        c.router_jitter_noise = v
        assert fam.input_refusals(c) == [(True, "router_jitter_noise", v, why)]


def test_mixtral_model_and_hf_fields():
    fam = _fam("mixtral")
    for case, window in (("mixtral-gqa-headdim", None), ("mixtral-window", 5)):
        c = case_config(case)
        assert fam.model_fields(c) == dict(n_experts=c.num_local_experts, expert_hidden=c.intermediate_size,
                                           renormalize=True, sliding_window=window)
        m = _ours(case)
        assert fam.hf_fields(m) == dict(intermediate_size=c.intermediate_size, num_local_experts=c.num_local_experts,
                                        sliding_window=window, router_jitter_noise=0.0)
    c = case_config("mixtral-gqa-headdim")
    c.num_local_experts, c.intermediate_size = 7, 9
    assert fam.model_fields(c)["n_experts"] == 7 and fam.model_fields(c)["expert_hidden"] == 9


def test_mixtral_refusals_exact_and_one_by_one():
    fam = _fam("mixtral")
    m = _ours("mixtral-gqa-headdim")
    assert fam.refusals(m) == MIXTRAL_WHY
    n = len(MIXTRAL_WHY)
    one = [dict(n_shared_experts=1), dict(n_dense_layers=1), dict(dense_layers=[1]), dict(qk_norm="head"),
           dict(qkv_bias=True), dict(attn_out_bias=True), dict(clip_qkv=1.0),
           dict(router=dataclasses.replace(m.router, renormalize=False))]
    values = [1, 1, [1], "head", True, True, 1.0, False]
    for i, (change, value) in enumerate(zip(one, values)):
        got = fam.refusals(dataclasses.replace(m, **change))
        assert _flags(got) == _only(n, i), (i, got)
        assert got[i] == (True, MIXTRAL_WHY[i][1], value, MIXTRAL_WHY[i][3])
    # a value that is not exactly True is refused as well (renormalize is not True)
    got = fam.refusals(dataclasses.replace(m, router=dataclasses.replace(m.router, renormalize=1)))
    assert got[-1][0] is True


# ------------------------------------------------------------------ Qwen2-MoE (moe/hf/families/qwen2_moe.py)

QWEN2_WHY = [
    (False, "model.n_shared_experts", 1, "every Qwen2-MoE layer has a (gated) shared expert"),
    (False, "model.shared_expert_gate", True, "Qwen2-MoE always scales its shared expert by a sigmoid gate"),
    (False, "model.qk_norm", "none", "Qwen2-MoE has no qk-norm"),
    (False, "model.attn_out_bias", False, "Qwen2-MoE's output projection has no bias"),
    (False, "model.clip_qkv", None, "Qwen2-MoE does not clip q/k/v"),
]


def test_qwen2_input_refusals():
    fam = _fam("qwen2_moe")
    c = case_config("qwen2-window")
    types = list(c.layer_types)
    assert fam.input_refusals(c) == [
        (False, "layer_types", types, "layer kinds [] are not full or sliding attention"),
        (False, "num_experts", c.num_experts, "a model without experts is not an MoE"),
        (False, "shared_expert_intermediate_size", c.shared_expert_intermediate_size,
         "Qwen2-MoE layers always have a shared expert"),
    ]
    c.layer_types = ["sliding_attention", "zeta", "chunked_attention"]
    got = fam.input_refusals(c)
    assert _flags(got) == [True, False, False]
    assert got[0] == (True, "layer_types", c.layer_types,
                      "layer kinds ['chunked_attention', 'zeta'] are not full or sliding attention")
    c.layer_types = None
    assert _flags(fam.input_refusals(c)) == [False, False, False]
    c = case_config("qwen2-window")
    c.num_experts = 1
    assert _flags(fam.input_refusals(c)) == [False, False, False]
    c.num_experts = 0
    assert fam.input_refusals(c)[1] == (True, "num_experts", 0, "a model without experts is not an MoE")
    c = case_config("qwen2-window")
    c.shared_expert_intermediate_size = 1
    assert _flags(fam.input_refusals(c)) == [False, False, False]
    c.shared_expert_intermediate_size = 0
    assert fam.input_refusals(c)[2] == (True, "shared_expert_intermediate_size", 0,
                                        "Qwen2-MoE layers always have a shared expert")
    assert _flags(fam.input_refusals(c)) == [False, False, True]


@pytest.mark.parametrize("case", ["qwen2-step2-headdim", "qwen2-window", "qwen2-mha-tied-mlponly"])
def test_qwen2_model_and_hf_fields(case):
    fam = _fam("qwen2_moe")
    c = case_config(case)
    assert fam.model_fields(c) == dict(
        n_experts=c.num_experts, expert_hidden=c.moe_intermediate_size, dense_hidden=c.intermediate_size,
        dense_layers=dense_ids_of(c.decoder_sparse_step, c.mlp_only_layers, c.num_hidden_layers), n_shared_experts=1,
        shared_expert_hidden=c.shared_expert_intermediate_size, shared_expert_gate=True, qkv_bias=bool(c.qkv_bias),
        renormalize=bool(c.norm_topk_prob), **layer_fields(c))
    m = _ours(case)
    assert fam.hf_fields(m) == dict(
        intermediate_size=c.intermediate_size, moe_intermediate_size=c.moe_intermediate_size,
        shared_expert_intermediate_size=c.shared_expert_intermediate_size, num_experts=c.num_experts,
        norm_topk_prob=bool(c.norm_topk_prob), qkv_bias=bool(c.qkv_bias), decoder_sparse_step=c.decoder_sparse_step,
        mlp_only_layers=list(c.mlp_only_layers), **hf_layer_fields(m))
    no_dense = dataclasses.replace(m, dense_hidden=None)
    assert fam.hf_fields(no_dense)["intermediate_size"] == m.expert_hidden * m.router.top_k


def test_qwen2_fields_values():
    fam = _fam("qwen2_moe")
    f = fam.model_fields(case_config("qwen2-step2-headdim"))
    assert (f["dense_layers"], f["qkv_bias"], f["renormalize"], f["n_shared_experts"]) == ([0, 2], True, False, 1)
    assert fam.model_fields(case_config("qwen2-mha-tied-mlponly"))["dense_layers"] == [2]
    w = fam.model_fields(case_config("qwen2-window"))
    assert (w["layer_types"], w["sliding_window"], w["renormalize"]) == (["sliding", "full", "sliding"], 4, True)
    h = fam.hf_fields(_ours("qwen2-step2-headdim"))
    assert (h["decoder_sparse_step"], h["mlp_only_layers"], h["use_sliding_window"]) == (2, [], False)


def test_qwen2_refusals_exact_and_one_by_one():
    fam = _fam("qwen2_moe")
    m = _ours("qwen2-step2-headdim")
    assert fam.refusals(m) == QWEN2_WHY
    n = len(QWEN2_WHY)
    got = fam.refusals(dataclasses.replace(m, n_shared_experts=0))
    assert _flags(got) == _only(n, 0) and got[0] == (True, "model.n_shared_experts", 0, QWEN2_WHY[0][3])
    got = fam.refusals(dataclasses.replace(m, n_shared_experts=0, shared_expert_gate=False))
    assert _flags(got) == _only(n, 0)  # no shared expert: its gate is not asked for
    for i, (change, value) in enumerate([(dict(shared_expert_gate=False), False), (dict(qk_norm="head"), "head"),
                                         (dict(attn_out_bias=True), True), (dict(clip_qkv=1.0), 1.0)], start=1):
        got = fam.refusals(dataclasses.replace(m, **change))
        assert _flags(got) == _only(n, i), (i, got)
        assert got[i] == (True, QWEN2_WHY[i][1], value, QWEN2_WHY[i][3])
    two = dataclasses.replace(m, n_shared_experts=2, shared_expert_gate=False)
    assert _flags(fam.refusals(two)) == _only(n, 1)


# ------------------------------------------------------------------ Qwen3-MoE (moe/hf/families/qwen3_moe.py)

def _qwen3_why(m):
    return [
        (False, "model.qk_norm", m.qk_norm, "Qwen3-MoE normalises each q and k head ('head')"),
        (False, "model.qkv_bias", m.qkv_bias, "Qwen3-MoE's attention_bias puts biases on all four projections or "
         f"none (model.attn_out_bias={m.attn_out_bias})"),
        (False, "model.clip_qkv", m.clip_qkv, "Qwen3-MoE does not clip q/k/v"),
        (False, "model.n_shared_experts", m.n_shared_experts, "Qwen3-MoE has no shared experts"),
    ]


def test_qwen3_input_refusals():
    fam = _fam("qwen3_moe")
    c = case_config("qwen3-headdim-mlponly")
    want = [(False, "use_sliding_window", False, "our attention is full causal attention"),
            (False, "num_experts", c.num_experts, "a model without experts is not an MoE")]
    assert fam.input_refusals(c) == want
    c.use_sliding_window = True
    assert fam.input_refusals(c) == [(True, "use_sliding_window", True, want[0][3]), want[1]]
    c = case_config("qwen3-headdim-mlponly")
    c.num_experts = 1
    assert _flags(fam.input_refusals(c)) == [False, False]
    c.num_experts = 0
    assert fam.input_refusals(c) == [want[0], (True, "num_experts", 0, want[1][3])]


@pytest.mark.parametrize("case", ["qwen3-headdim-mlponly", "qwen3-gqa1-bias-step2-tied"])
def test_qwen3_model_and_hf_fields(case):
    fam = _fam("qwen3_moe")
    c = case_config(case)
    bias = bool(c.attention_bias)
    assert fam.model_fields(c) == dict(
        n_experts=c.num_experts, expert_hidden=c.moe_intermediate_size, dense_hidden=c.intermediate_size,
        dense_layers=dense_ids_of(c.decoder_sparse_step, c.mlp_only_layers, c.num_hidden_layers), qk_norm="head",
        qkv_bias=bias, attn_out_bias=bias, renormalize=bool(c.norm_topk_prob))
    m = _ours(case)
    assert fam.hf_fields(m) == dict(
        intermediate_size=c.intermediate_size, moe_intermediate_size=c.moe_intermediate_size, num_experts=c.num_experts,
        norm_topk_prob=bool(c.norm_topk_prob), attention_bias=bias, decoder_sparse_step=c.decoder_sparse_step,
        mlp_only_layers=list(c.mlp_only_layers), use_sliding_window=False, sliding_window=None)
    assert fam.hf_fields(dataclasses.replace(m, dense_hidden=None))["intermediate_size"] == \
        m.expert_hidden * m.router.top_k


def test_qwen3_fields_values():
    fam = _fam("qwen3_moe")
    f = fam.model_fields(case_config("qwen3-gqa1-bias-step2-tied"))
    assert (f["dense_layers"], f["qkv_bias"], f["attn_out_bias"], f["renormalize"]) == ([0, 2], True, True, False)
    f = fam.model_fields(case_config("qwen3-headdim-mlponly"))
    assert (f["dense_layers"], f["qkv_bias"], f["attn_out_bias"], f["renormalize"]) == ([0], False, False, True)
    assert fam.hf_fields(_ours("qwen3-gqa1-bias-step2-tied"))["decoder_sparse_step"] == 2


@pytest.mark.parametrize("case", ["qwen3-headdim-mlponly", "qwen3-gqa1-bias-step2-tied"])
def test_qwen3_refusals_exact_and_one_by_one(case):
    fam = _fam("qwen3_moe")
    m = _ours(case)
    why = _qwen3_why(m)
    assert fam.refusals(m) == why
    assert (m.qk_norm, m.clip_qkv, m.n_shared_experts) == ("head", None, 0)
    for i, change in enumerate([dict(qk_norm="full"), dict(qkv_bias=not m.qkv_bias), dict(clip_qkv=1.0),
                                dict(n_shared_experts=1)]):
        bad = dataclasses.replace(m, **change)
        got = fam.refusals(bad)
        assert _flags(got) == _only(4, i), (i, got)
        assert got[i] == (True,) + _qwen3_why(bad)[i][1:]
    got = fam.refusals(dataclasses.replace(m, qkv_bias=False, attn_out_bias=True))
    assert got[1] == (True, "model.qkv_bias", False, "Qwen3-MoE's attention_bias puts biases on all four "
                      "projections or none (model.attn_out_bias=True)")


# ------------------------------------------------------------------ OLMoE (moe/hf/families/olmoe.py)

def _olmoe_why(m):
    return [
        (False, "model.qk_norm", m.qk_norm, "OLMoE normalises the whole q and k outputs ('full')"),
        (False, "model.qkv_bias", m.qkv_bias, "OLMoE's attention_bias puts biases on all four projections or none "
         f"(model.attn_out_bias={m.attn_out_bias})"),
        (False, "model.head_dim", m.head_dim, "OLMoE's head dim is hidden_size / heads"),
        (False, "model.n_shared_experts", m.n_shared_experts, "OLMoE has no shared experts"),
        (False, "model.dense_layers", m.dense_layer_ids, "every OLMoE layer is an MoE layer"),
    ]


@pytest.mark.parametrize("case", ["olmoe-gqa1-bias-clip", "olmoe-tied-renorm"])
def test_olmoe_input_refusals(case):
    fam = _fam("olmoe")
    c = case_config(case)
    d = c.hidden_size // c.num_attention_heads
    why = f"OLMoE's q_norm is hidden_size wide, so the head dim must be hidden_size / heads = {d}"
    assert fam.input_refusals(c) == [(False, "head_dim", d, why)]
    c.head_dim = 2 * d
    assert fam.input_refusals(c) == [(True, "head_dim", 2 * d, why)]
    c.head_dim = d + 1
    assert fam.input_refusals(c) == [(True, "head_dim", d + 1, why)]
    c.head_dim = d
    assert fam.input_refusals(c)[0][0] is False
    c.hidden_size = 36  # 36 // 4 = 9, with head_dim 8: refused, and the message names 9 (an int)
    assert fam.input_refusals(c) == [(True, "head_dim", d, "OLMoE's q_norm is hidden_size wide, so the head dim "
                                      "must be hidden_size / heads = 9")]
    c.hidden_size, c.head_dim = 34, 8  # 34 // 4 = 8: accepted (integer division, as hf_head_dim's default)
    assert fam.input_refusals(c)[0][0] is False and hf_head_dim(c) == 8


@pytest.mark.parametrize("case", ["olmoe-gqa1-bias-clip", "olmoe-tied-renorm"])
def test_olmoe_model_and_hf_fields(case):
    fam = _fam("olmoe")
    c = case_config(case)
    bias = bool(c.attention_bias)
    assert fam.model_fields(c) == dict(n_experts=c.num_experts, expert_hidden=c.intermediate_size, qk_norm="full",
                                       qkv_bias=bias, attn_out_bias=bias, clip_qkv=c.clip_qkv,
                                       renormalize=bool(c.norm_topk_prob))
    m = _ours(case)
    assert fam.hf_fields(m) == dict(intermediate_size=c.intermediate_size, num_experts=c.num_experts,
                                    norm_topk_prob=bool(c.norm_topk_prob), attention_bias=bias, clip_qkv=c.clip_qkv)


def test_olmoe_fields_values():
    fam = _fam("olmoe")
    f = fam.model_fields(case_config("olmoe-gqa1-bias-clip"))
    assert (f["qkv_bias"], f["attn_out_bias"], f["clip_qkv"], f["renormalize"]) == (True, True, 0.9, False)
    f = fam.model_fields(case_config("olmoe-tied-renorm"))
    assert (f["qkv_bias"], f["attn_out_bias"], f["clip_qkv"], f["renormalize"]) == (False, False, None, True)


@pytest.mark.parametrize("case", ["olmoe-gqa1-bias-clip", "olmoe-tied-renorm"])
def test_olmoe_refusals_exact_and_one_by_one(case):
    fam = _fam("olmoe")
    m = _ours(case)
    assert fam.refusals(m) == _olmoe_why(m)
    assert (m.qk_norm, m.n_shared_experts, m.dense_layer_ids) == ("full", 0, [])
    hd = m.d_model // m.n_heads
    for i, change in enumerate([dict(qk_norm="head"), dict(qkv_bias=not m.qkv_bias), dict(head_dim=hd + 1),
                                dict(n_shared_experts=1), dict(dense_layers=[1])]):
        bad = dataclasses.replace(m, **change)
        got = fam.refusals(bad)
        assert _flags(got) == _only(5, i), (i, got)
        want = _olmoe_why(bad)[i]
        assert got[i] == (True,) + want[1:]
    assert _flags(fam.refusals(dataclasses.replace(m, head_dim=hd))) == [False] * 5
    got = fam.refusals(dataclasses.replace(m, n_dense_layers=1))
    assert got[4] == (True, "model.dense_layers", [0], "every OLMoE layer is an MoE layer")


# ------------------------------------------------------------------ DeepSeek-V3 (moe/hf/families/deepseek_v3.py)

@pytest.mark.parametrize("case", ["deepseek_v3-sigmoid-bias-groups", "deepseek_v3-nogroup-tied-halfrot"])
def test_deepseek_v3_router_config(case):
    from moe.routing.routers import router_config

    fam = _fam("deepseek_v3")
    c = case_config(case)
    fields = {"renormalize": bool(c.norm_topk_prob), "other": 1}
    r = fam.router_config(c, fields)
    assert fields == {"other": 1}  # renormalize is taken out of the model fields
    assert r == router_config("aux_free", top_k=c.num_experts_per_tok, renormalize=bool(c.norm_topk_prob),
                              aux_loss_coef=0.0, z_loss_coef=0.0, score_func="sigmoid", bias_update_rate=0.001,
                              n_groups=c.n_group, topk_groups=c.topk_group, group_score_top=2)
    assert (r.name, r.score_func, r.bias_update_rate, r.group_score_top, r.z_loss_coef) == (
        "aux_free", "sigmoid", 0.001, 2, 0.0)
    assert (r.top_k, r.renormalize, r.n_groups, r.topk_groups) == (
        c.num_experts_per_tok, bool(c.norm_topk_prob), c.n_group, c.topk_group)
    c.router_aux_loss_coef = 0.25  # a config that carries it (DeepseekV3Config itself does not)
    assert fam.router_config(c, {"renormalize": True}).aux_loss_coef == 0.25
    c.n_group, c.topk_group = None, None
    r = fam.router_config(c, {"renormalize": False})
    assert (r.n_groups, r.topk_groups, r.renormalize) == (1, 1, False)
    c.n_group, c.topk_group = 2, 2
    r = fam.router_config(c, {"renormalize": True})
    assert (r.n_groups, r.topk_groups) == (2, 2)


def test_deepseek_v3_aux_loss_default():
    fam = _fam("deepseek_v3")
    c = case_config("deepseek_v3-sigmoid-bias-groups")
    if hasattr(c, "router_aux_loss_coef"):
        del c.router_aux_loss_coef
    assert not hasattr(c, "router_aux_loss_coef")
    assert fam.router_config(c, {"renormalize": True}).aux_loss_coef == 0.0


def test_deepseek_v3_input_refusals():
    fam = _fam("deepseek_v3")
    v2 = _fam("deepseek_v2")
    c = case_config("deepseek_v3-sigmoid-bias-groups")  # 8 experts in 4 groups: 2 a group
    why = "noaux_tc scores a group by its two best experts: a group needs two"
    got = fam.input_refusals(c)
    assert got[:-1] == type(v2).input_refusals(fam, c) and len(got) == len(type(v2).input_refusals(fam, c)) + 1
    assert got[-1] == (False, "n_group", 4, why)
    assert not any(_flags(got))
    for E, groups, refused in [(8, 8, True), (8, 5, True), (8, 4, False), (8, 3, False), (8, 2, False),
                               (8, 1, False), (8, None, False), (1, 1, False), (1, None, False), (3, 2, True),
                               (2, 1, False)]:
        c.n_routed_experts, c.n_group = E, groups
        assert fam.input_refusals(c)[-1] == (refused, "n_group", groups, why), (E, groups)


def test_deepseek_v3_router_refusals():
    fam = _fam("deepseek_v3")
    m = _ours("deepseek_v3-sigmoid-bias-groups")
    r = m.router
    want = [(False, "router.name", "aux_free", "DeepSeek-V3 routes with noaux_tc ('aux_free')"),
            (False, "router.score_func", "sigmoid", "DeepSeek-V3 scores experts with a sigmoid"),
            (False, "router.group_score_top", 2, "DeepSeek-V3 scores a group by its two best experts")]
    got = fam.router_refusals(m)
    assert got[:3] == want and got[3:] == fam.shared_router_refusals(m) and len(got) > 3
    got = fam.router_refusals(dataclasses.replace(m, router=dataclasses.replace(r, score_func="softmax")))
    assert _flags(got[:3]) == [False, True, False] and got[1][2] == "softmax"
    got = fam.router_refusals(dataclasses.replace(m, router=dataclasses.replace(r, group_score_top=1)))
    assert got[2] == (True, "router.group_score_top", 1, want[2][3]) and _flags(got[:2]) == [False, False]
    one = dataclasses.replace(r, n_groups=1, topk_groups=1, group_score_top=1)
    assert _flags(fam.router_refusals(dataclasses.replace(m, router=one))[:3]) == [False, False, False]
    two = dataclasses.replace(r, n_groups=2, topk_groups=1, group_score_top=3)
    assert fam.router_refusals(dataclasses.replace(m, router=two))[2] == (True, "router.group_score_top", 3, want[2][3])
    # a softmax top-k router: no score_func, no group_score_top field values of its own
    topk = _ours("olmoe-tied-renorm").router
    got = fam.router_refusals(dataclasses.replace(m, router=topk))
    assert got[0] == (True, "router.name", "topk", want[0][3])
    assert got[1] == (True, "router.score_func", getattr(topk, "score_func", None), want[1][3])
    assert got[2][0] is False


class _R:
    """A stand-in config object with only the given attributes (getattr's defaults are what decides)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_deepseek_v3_router_refusals_defaults():
    fam = _fam("deepseek_v3")
    fam.shared_router_refusals = lambda m: []  # DeepSeek-V2's own list (not this module's) left out
    got = fam.router_refusals(_R(router=_R(name="aux_free", n_groups=2)))
    assert got == [(False, "router.name", "aux_free", "DeepSeek-V3 routes with noaux_tc ('aux_free')"),
                   (True, "router.score_func", None, "DeepSeek-V3 scores experts with a sigmoid"),
                   (True, "router.group_score_top", None, "DeepSeek-V3 scores a group by its two best experts")]
    got = fam.router_refusals(_R(router=_R(name="aux_free", score_func="sigmoid", group_score_top=1)))
    assert got[1][0] is False and got[2] == (False, "router.group_score_top", 1,
                                             "DeepSeek-V3 scores a group by its two best experts")
    got = fam.router_refusals(_R(router=_R(name="aux_free", score_func="sigmoid", n_groups=2)))
    assert got[2] == (True, "router.group_score_top", None, "DeepSeek-V3 scores a group by its two best experts")


@pytest.mark.parametrize("case", ["deepseek_v3-sigmoid-bias-groups", "deepseek_v3-nogroup-tied-halfrot"])
def test_deepseek_v3_hf_fields(case):
    fam = _fam("deepseek_v3")
    c = case_config(case)
    m = _ours(case)
    assert m.mtp_depth == 0
    assert fam.hf_fields(m) == dict(**fam.shared_hf_fields(m), n_group=c.n_group, topk_group=c.topk_group,
                                    norm_topk_prob=bool(c.norm_topk_prob), rope_interleave=bool(c.rope_interleave))
    assert "num_nextn_predict_layers" not in fam.hf_fields(m)
    f = fam.hf_fields(dataclasses.replace(m, mtp_depth=2))
    assert f["num_nextn_predict_layers"] == 2
    assert (f["norm_topk_prob"], f["rope_interleave"]) == (bool(c.norm_topk_prob), bool(c.rope_interleave))
    flipped = dataclasses.replace(m, rope_interleave=not m.rope_interleave,
                                  router=dataclasses.replace(m.router, renormalize=not m.router.renormalize))
    g = fam.hf_fields(flipped)
    assert (g["norm_topk_prob"], g["rope_interleave"]) == (not bool(c.norm_topk_prob), not bool(c.rope_interleave))
    assert g["norm_topk_prob"] is (not bool(c.norm_topk_prob)) and type(g["rope_interleave"]) is bool


def test_deepseek_v3_stored_mtp_depth():
    fam = _fam("deepseek_v3")
    c = case_config("deepseek_v3-sigmoid-bias-groups")
    n = c.num_hidden_layers

    def names(*layers):
        return {f"model.layers.{i}.eh_proj.weight" for i in layers} | {"model.embed_tokens.weight"}

    c.num_nextn_predict_layers = 2
    assert fam.stored_mtp_depth(c, names()) == 0
    assert fam.stored_mtp_depth(c, names(n - 1)) == 0  # a decoder layer's name is not an MTP layer
    assert fam.stored_mtp_depth(c, names(n)) == 1
    assert fam.stored_mtp_depth(c, names(n, n + 1)) == 2
    assert fam.stored_mtp_depth(c, names(n, n + 1, n + 2)) == 2  # no more than the config states
    assert fam.stored_mtp_depth(c, names(n + 1)) == 0  # the first missing stops the count
    assert fam.stored_mtp_depth(c, {f"model.layers.{n}.enorm.weight"}) == 0
    c.num_nextn_predict_layers = 1
    assert fam.stored_mtp_depth(c, names(n, n + 1)) == 1
    c.num_nextn_predict_layers = 0
    assert fam.stored_mtp_depth(c, names(n, n + 1)) == 0
    c.num_nextn_predict_layers = None
    assert fam.stored_mtp_depth(c, names(n, n + 1)) == 0
    del c.num_nextn_predict_layers
    assert fam.stored_mtp_depth(c, names(n, n + 1)) == 0


# ------------------------------------------------------------------ the survivors of the first passes (README.md of the run)

def test_mixtral_window_with_explicit_uniform_layer_types():
    """A uniform window stated per layer (layer_types all "sliding") is expressible by Mixtral and
    exports its window; so is a one-layer model with explicit layer types (layer 0 is the only one)."""
    from moe.hf.convert import hf_config

    fam = _fam("mixtral")
    m = _ours("mixtral-window")
    every = dataclasses.replace(m, layer_types=["sliding"] * m.n_layers)
    assert fam.hf_fields(every)["sliding_window"] == 5
    assert hf_config(every, "mixtral").sliding_window == 5
    for types, window in ((["sliding"], 5), (["full"], None)):
        one = dataclasses.replace(m, n_layers=1, layer_types=types, sliding_window=window)
        assert fam.hf_fields(one)["sliding_window"] == window
        assert hf_config(one, "mixtral").sliding_window == window


def test_deepseek_v3_router_top_k_is_read():
    fam = _fam("deepseek_v3")
    c = case_config("deepseek_v3-sigmoid-bias-groups")
    for k in (1, 3):
        c.num_experts_per_tok = k
        assert fam.router_config(c, {"renormalize": True}).top_k == k
    assert model_config_from_hf(c).router.top_k == 3
