"""moe/hf/tensor_map.py, table by table, without loading or saving a checkpoint (the sixth mutation
run, docs/results/mutation/run6_mutH/): for every family of tests/hf_fixtures.py the memory layout
is exactly the names and shapes of transformers' own model (built on the meta device), the hub
layout covers every element of ours exactly once, the rows put q/k/v, gate/up and each expert
where the module docstring says, and the refusals and the route's edge cases behave as documented."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moe.errors import ConfigError
from moe.hf.convert import model_config_from_hf
from moe.hf.families import family
from moe.hf.tensor_map import copy_hf_tensor_, hf_tensors, load_route, tensor_rows
from moe.meta import meta_device
from moe.model import Transformer
from tests.hf_fixtures import CASES, hf_config


def _hf_meta(case: str):
    from transformers import AutoModelForCausalLM
    with meta_device():
        return AutoModelForCausalLM.from_config(hf_config(case))


def _ours(case: str, meta: bool = True, **replace):
    c = hf_config(case)
    cfg = model_config_from_hf(c, attention="eager", experts="loop")
    cfg = dataclasses.replace(cfg, **replace) if replace else cfg
    if meta:
        with meta_device():
            return Transformer(cfg), family(c.model_type)
    torch.manual_seed(0)
    model = Transformer(cfg)
    with torch.no_grad():  # distinct values everywhere, so that a misplaced row shows
        for i, p in enumerate(model.state_dict().values()):
            if p.is_floating_point():
                p.copy_(torch.randn(p.shape) + i)
    return model, family(c.model_type)


@pytest.mark.parametrize("case", sorted(CASES))
def test_memory_layout_is_exactly_transformers_names_and_shapes(case):
    model, fam = _ours(case)
    hf_sd = _hf_meta(case).state_dict()
    rows = list(tensor_rows(model.cfg, fam, "memory"))
    assert sorted(r[0] for r in rows) == sorted(hf_sd), case
    out = hf_tensors(model.state_dict(), model.cfg, fam, "memory")
    assert {k: tuple(v.shape) for k, v in out.items()} == {k: tuple(v.shape) for k, v in hf_sd.items()}
    # every tensor of ours (its persistent state) is reached by some row
    ours = {n for n, _ in model.state_dict().items() if not n.startswith("rotary.")}
    assert {r[1] for r in rows} == ours - ({"lm_head.weight"} - {r[1] for r in rows}), case


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("layout", ["hub", "memory"])
def test_every_element_of_ours_is_covered_exactly_once(case, layout):
    """Each row's index takes a distinct part of ours: the parts of one tensor add up to it, once."""
    model, fam = _ours(case, meta=False)
    state = model.state_dict()
    count = {n: torch.zeros(t.shape, dtype=torch.int32) for n, t in state.items()}
    seen = set()
    for hf_name, our_name, index in tensor_rows(model.cfg, fam, layout):
        assert hf_name not in seen, hf_name
        seen.add(hf_name)
        count[our_name][index] += 1
    tied = model.cfg.tie_embeddings
    for name, c in count.items():
        if name.startswith("rotary."):
            continue
        # a tied head is the embedding's tensor: the files hold it once (as the embedding)
        expected = 0 if (name == "lm_head.weight" and tied and layout == "hub") else 1
        assert torch.equal(c, torch.full_like(c, expected)), (name, c.unique())


def _round_trip(case, layout):
    model, fam = _ours(case, meta=False)
    state = model.state_dict()
    hf_sd = hf_tensors(state, model.cfg, fam, layout)
    fresh, _ = _ours(case, meta=False)
    zero = fresh.state_dict()
    with torch.no_grad():
        for t in zero.values():
            t.zero_()
    return model, fam, state, hf_sd, zero


@pytest.mark.parametrize("case", ["mixtral-gqa-headdim", "qwen2-step2-headdim", "gpt_oss-gqa1-nobias",
                                  "deepseek_v3-sigmoid-bias-groups", "deepseek_v2-lite-yarn",
                                  "qwen3-gqa1-bias-step2-tied"])
def test_memory_layout_round_trips_through_copy_hf_tensor(case):
    model, fam, state, hf_sd, zero = _round_trip(case, "memory")
    with torch.no_grad():
        copy_hf_tensor_(zero, model.cfg, fam, hf_sd)
    for name, t in state.items():
        if not name.startswith("rotary."):
            assert torch.equal(zero[name], t), name


@pytest.mark.parametrize("case", ["mixtral-gqa-headdim", "qwen2-mha-tied-mlponly", "gpt_oss-mha-yarn-tied",
                                  "deepseek_v3-nogroup-tied-halfrot", "deepseek_v2-group-qlora"])
def test_hub_layout_round_trips_through_the_load_route(case):
    model, fam, state, hf_sd, zero = _round_trip(case, "hub")
    route = load_route(model.cfg, fam)
    with torch.no_grad():
        for hf_name, t in hf_sd.items():
            places = route(hf_name)
            assert len(places) == 1, (hf_name, places)
            p = places[0]
            zero[p.target][p.index].copy_(t if p.transform is None else p.transform(t))
    for name, t in state.items():
        if not name.startswith("rotary."):
            assert torch.equal(zero[name], t), name


def test_rows_put_qkv_gate_up_and_experts_where_the_docstring_says():
    case = "qwen2-step2-headdim"  # GQA, head_dim != hidden / heads, qkv bias, shared expert + gate, dense layers
    model, fam = _ours(case, meta=False)
    cfg, state = model.cfg, model.state_dict()
    d, H, G, Hx = cfg.resolved_head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.expert_hidden
    hub = hf_tensors(state, cfg, fam)  # the default layout: hub
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in hub
    moe_layer = next(i for i in range(cfg.n_layers) if cfg.is_moe_layer(i))
    dense_layer = next(i for i in range(cfg.n_layers) if not cfg.is_moe_layer(i))
    p, o = f"model.layers.{moe_layer}.", f"layers.{moe_layer}."
    qkv, bias = state[o + "attn.qkv_proj.weight"], state[o + "attn.qkv_proj.bias"]
    assert torch.equal(hub[p + "self_attn.q_proj.weight"], qkv[: H * d])
    assert torch.equal(hub[p + "self_attn.k_proj.weight"], qkv[H * d:(H + G) * d])
    assert torch.equal(hub[p + "self_attn.v_proj.weight"], qkv[(H + G) * d:])
    assert torch.equal(hub[p + "self_attn.v_proj.bias"], bias[(H + G) * d:])
    assert torch.equal(hub[p + "self_attn.q_proj.bias"], bias[: H * d])
    gu, down = state[o + "ffn.experts.gate_up_proj"], state[o + "ffn.experts.down_proj"]
    for e in range(cfg.n_experts):
        assert torch.equal(hub[p + f"mlp.experts.{e}.gate_proj.weight"], gu[e, :Hx])
        assert torch.equal(hub[p + f"mlp.experts.{e}.up_proj.weight"], gu[e, Hx:])
        assert torch.equal(hub[p + f"mlp.experts.{e}.down_proj.weight"], down[e])
    assert torch.equal(hub[p + "mlp.gate.weight"], state[o + "ffn.router.weight"])
    assert torch.equal(hub[p + "mlp.shared_expert.up_proj.weight"], state[o + "ffn.shared.up_proj.weight"])
    assert torch.equal(hub[p + "mlp.shared_expert_gate.weight"], state[o + "ffn.shared_gate.weight"])
    q = f"model.layers.{dense_layer}.mlp."
    for proj in ("gate_proj", "up_proj", "down_proj"):
        assert torch.equal(hub[q + f"{proj}.weight"], state[f"layers.{dense_layer}.ffn.{proj}.weight"])
    assert torch.equal(hub["model.embed_tokens.weight"], state["embed.weight"])
    assert torch.equal(hub["model.norm.weight"], state["norm.weight"])
    assert torch.equal(hub["lm_head.weight"], state["lm_head.weight"])
    # detached views of ours, not copies
    assert hub["model.embed_tokens.weight"].data_ptr() == state["embed.weight"].data_ptr()
    assert hub[p + "self_attn.k_proj.weight"].data_ptr() == qkv[H * d:].data_ptr()


def test_mixtral_hub_names_and_tied_head():
    case = "mixtral-mha-tied"
    model, fam = _ours(case)
    cfg = model.cfg
    hub = [r[0] for r in tensor_rows(cfg, fam, "hub")]
    assert hub[0] == "model.embed_tokens.weight" and hub[-1] == "model.norm.weight"
    assert "lm_head.weight" not in hub  # tied: not in the files
    assert [r[0] for r in tensor_rows(cfg, fam)] == hub  # hub is the default
    assert list(tensor_rows(cfg, fam, "memory"))[-1] == ("lm_head.weight", "lm_head.weight", ())
    expected = ["model.embed_tokens.weight"]
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        expected += [p + "input_layernorm.weight"] + [p + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        expected += [p + "post_attention_layernorm.weight", p + "block_sparse_moe.gate.weight"]
        for e in range(cfg.n_experts):
            expected += [p + f"block_sparse_moe.experts.{e}.{w}.weight" for w in ("w1", "w3", "w2")]
    assert hub == expected + ["model.norm.weight"]
    untied, fam = _ours(case, tie_embeddings=False)
    assert [r for r in tensor_rows(untied.cfg, fam, "hub")][-1] == ("lm_head.weight", "lm_head.weight", ())


def test_an_unknown_layout_is_refused_with_the_choices():
    model, fam = _ours("mixtral-gqa-headdim")
    with pytest.raises(ValueError) as err:
        list(tensor_rows(model.cfg, fam, "disk"))
    assert str(err.value) == "layout='disk'; choose one of ['hub', 'memory']"


def test_a_state_quantized_in_a_foreign_format_is_refused_on_export():
    model, fam = _ours("mixtral-gqa-headdim", meta=False)
    state = dict(model.state_dict())
    del state["layers.0.ffn.experts.down_proj"]  # as a quantized model's state holds other buffers
    with pytest.raises(ConfigError) as err:
        hf_tensors(state, model.cfg, fam)
    assert str(err.value) == ("layers.0.ffn.experts.down_proj is quantized in a format Mixtral checkpoints "
                              "cannot store; export the full-precision checkpoint")


def test_mtp_rows_are_in_the_files_only_and_their_copies_are_not_aliases():
    case = "deepseek_v3-sigmoid-bias-groups"
    model, fam = _ours(case, meta=False, mtp_depth=1)
    cfg, state = model.cfg, model.state_dict()
    n = cfg.n_layers
    memory = {r[0] for r in tensor_rows(cfg, fam, "memory")}
    hub = {r[0]: r for r in tensor_rows(cfg, fam, "hub")}
    assert not any(k.startswith(f"model.layers.{n}.") for k in memory)
    p = f"model.layers.{n}."
    assert hub[p + "enorm.weight"][1:] == ("mtp.layers.0.enorm.weight", ())
    assert hub[p + "hnorm.weight"][1:] == ("mtp.layers.0.hnorm.weight", ())
    assert hub[p + "eh_proj.weight"][1:] == ("mtp.layers.0.eh_proj.weight", ())
    assert hub[p + "shared_head.norm.weight"][1:] == ("mtp.layers.0.norm.weight", ())
    assert hub[p + "embed_tokens.weight"][1:] == ("embed.weight", ())
    assert hub[p + "shared_head.head.weight"][1:] == ("lm_head.weight", ())
    assert hub[p + "self_attn.kv_a_proj_with_mqa.weight"][1] == "mtp.layers.0.block.attn.kv_a_proj.weight"
    assert hub[p + "mlp.gate.e_score_correction_bias"][1] == "mtp.layers.0.block.ffn.router.e_score_correction_bias"
    out = hf_tensors(state, cfg, fam, "hub")
    assert out["model.embed_tokens.weight"].data_ptr() == state["embed.weight"].data_ptr()  # first: a view
    copy = out[p + "embed_tokens.weight"]
    assert torch.equal(copy, state["embed.weight"]) and copy.data_ptr() != state["embed.weight"].data_ptr()
    head = out[p + "shared_head.head.weight"]
    assert torch.equal(head, state["lm_head.weight"]) and head.data_ptr() != state["lm_head.weight"].data_ptr()
    assert out["lm_head.weight"].data_ptr() == state["lm_head.weight"].data_ptr()


def test_mla_rows_with_and_without_q_lora():
    for case, q in (("deepseek_v2-lite-yarn", ["q_proj"]), ("deepseek_v2-group-qlora", ["q_a_proj", "q_b_proj"])):
        model, fam = _ours(case)
        rows = {r[0]: r[1] for r in tensor_rows(model.cfg, fam, "hub")}
        p, o = "model.layers.0.self_attn.", "layers.0.attn."
        names = {k[len(p):]: v[len(o):] for k, v in rows.items() if k.startswith(p)}
        want = {f"{x}.weight": f"{x}.weight" for x in q + ["kv_b_proj", "o_proj"]}
        want["kv_a_proj_with_mqa.weight"] = "kv_a_proj.weight"
        want["kv_a_layernorm.weight"] = "kv_a_norm.weight"
        if len(q) == 2:
            want["q_a_layernorm.weight"] = "q_a_norm.weight"
        assert names == want, case


def test_copy_hf_tensor_skips_and_leaves_absent_names_alone():
    model, fam, state, hf_sd, zero = _round_trip("mixtral-gqa-headdim", "memory")
    partial = {k: v for k, v in hf_sd.items() if k != "model.norm.weight"}
    with torch.no_grad():
        copy_hf_tensor_(zero, model.cfg, fam, partial, skip={"lm_head.weight"})
    assert not zero["norm.weight"].any() and not zero["lm_head.weight"].any()
    assert torch.equal(zero["embed.weight"], state["embed.weight"])


def test_the_route_rebuilds_derived_buffers_and_knows_no_other_names():
    model, fam = _ours("olmoe-tied-renorm")
    route = load_route(model.cfg, fam)
    assert route("model.layers.0.self_attn.rotary_emb.inv_freq") is None
    assert route("model.rotary_emb.inv_freq") is None
    assert route("model.layers.0.self_attn.rotary_emb.inv_freqs") == []
    assert route("model.layers.0.mystery.weight") == []
    # a tied model's extra lm_head.weight (memory layout only) is routed to our lm_head
    assert [p.target for p in route("lm_head.weight")] == ["lm_head.weight"]
    assert [(p.target, p.index, p.transform) for p in route("model.embed_tokens.weight")] == [("embed.weight", (), None)]
    gpt, gfam = _ours("gpt_oss-gqa1-nobias")
    places = load_route(gpt.cfg, gfam)("model.layers.0.mlp.experts.gate_up_proj")
    assert len(places) == 1 and places[0].transform is gfam.tensor_transform(
        "model.layers.0.mlp.experts.gate_up_proj")[0]


def test_mtp_depth_two_and_a_dense_last_layer():
    """Depth k is `model.layers.{n_layers + k}`; its block is built as the last layer's (dense here)."""
    case = "deepseek_v3-sigmoid-bias-groups"
    c = hf_config(case)
    cfg = model_config_from_hf(c, attention="eager", experts="loop")
    n = cfg.n_layers
    cfg = dataclasses.replace(cfg, mtp_depth=2, dense_layers=[n - 1])
    rows = {r[0]: r[1] for r in tensor_rows(cfg, family(c.model_type), "hub")}
    for k in range(2):
        p, o = f"model.layers.{n + k}.", f"mtp.layers.{k}."
        assert rows[p + "enorm.weight"] == o + "enorm.weight"
        assert rows[p + "mlp.gate_proj.weight"] == o + "block.ffn.gate_proj.weight"  # dense, as layer n - 1
        assert p + "mlp.gate.weight" not in rows
    assert not any(k.startswith(f"model.layers.{n + 2}.") for k in rows)
    assert rows[f"model.layers.{n - 1}.mlp.gate_proj.weight"] == f"layers.{n - 1}.ffn.gate_proj.weight"


def test_gpt_oss_experts_kept_as_mxfp4_are_written_as_blocks_and_scales():
    """A state whose experts are MXFP4 (no `experts.gate_up_proj`, but `gate_up_blocks` / `_scales`):
    the family's stored tensors take their place, and every other tensor is still written."""
    from moe.hf.mxfp4 import interleaved_rows_to_hf
    model, fam = _ours("gpt_oss-gqa1-nobias", meta=False)
    state = dict(model.state_dict())
    g = torch.Generator().manual_seed(0)
    for i in range(model.cfg.n_layers):
        for proj in ("gate_up", "down"):
            w = state.pop(f"layers.{i}.ffn.experts.{proj}_proj")
            E, R = w.shape[:2]
            state[f"layers.{i}.ffn.experts.{proj}_blocks"] = torch.randint(0, 256, (E, R, 1, 16), generator=g,
                                                                           dtype=torch.uint8)
            state[f"layers.{i}.ffn.experts.{proj}_scales"] = torch.randint(0, 256, (E, R, 1), generator=g,
                                                                           dtype=torch.uint8)
    out = hf_tensors(state, model.cfg, fam, "hub")
    plain = hf_tensors(model.state_dict(), model.cfg, fam, "hub")
    for i in range(model.cfg.n_layers):
        p = f"model.layers.{i}.mlp.experts."
        assert p + "gate_up_proj" not in out and p + "down_proj" not in out
        assert torch.equal(out[p + "gate_up_proj_blocks"],
                           interleaved_rows_to_hf(state[f"layers.{i}.ffn.experts.gate_up_blocks"]))
        assert torch.equal(out[p + "down_proj_scales"], state[f"layers.{i}.ffn.experts.down_scales"])
    assert set(out) == (set(plain) - {k for k in plain if k.endswith(("experts.gate_up_proj", "experts.down_proj"))}) | {
        f"model.layers.{i}.mlp.experts.{p}_proj_{part}" for i in range(model.cfg.n_layers)
        for p in ("gate_up", "down") for part in ("blocks", "scales")}
