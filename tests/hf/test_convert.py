"""Conversion to and from HF transformers' Mixtral (`moe/hf/convert.py`): fp32 logits agree with
`MixtralForCausalLM` both ways, state dicts round-trip exactly, and whatever Mixtral cannot
express is refused with a ConfigError naming the option."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM

from moe.config import ModelConfig
from moe.routing.routers import router_config
from moe.errors import ConfigError
from moe.hf.convert import (from_hf_model, from_hf_state_dict, mixtral_config, model_config_from_hf,
                            to_hf_model, to_hf_state_dict)
from moe.model import Transformer
from tests.conftest import with_variants
from tests.hf_fixtures import random_hf_model, random_ids as family_ids

B, T, ATOL = 2, 17, 1e-5

# Architecture cases: top-k, GQA vs MHA, tied vs untied, a head_dim that is not d_model/n_heads.
CASES = {
    "top2-gqa-untied": dict(top_k=2, n_heads=4, n_kv_heads=2, tie=False),
    "top1-mha-tied": dict(top_k=1, n_heads=4, n_kv_heads=4, tie=True),
    "top2-mha-tied": dict(top_k=2, n_heads=4, n_kv_heads=4, tie=True),
    "top1-gqa-untied-headdim": dict(top_k=1, n_heads=4, n_kv_heads=1, tie=False, head_dim=8),
}


def make_cfgs(top_k: int, n_heads: int, n_kv_heads: int, tie: bool, head_dim=None, n_experts: int = 6):
    model_cfg = ModelConfig(vocab_size=300, d_model=64, n_layers=2, n_heads=n_heads, n_kv_heads=n_kv_heads,
                            head_dim=head_dim, max_seq_len=32, rope_theta=500.0, norm_eps=1e-6,
                            tie_embeddings=tie, n_experts=n_experts, expert_hidden=48)
    router_cfg = router_config(top_k=top_k, z_loss_coef=0.0)
    return model_cfg, router_cfg


def randomize_(module: torch.nn.Module, seed: int) -> None:
    """Unit-scale random weights everywhere (norm gains too), so that every tensor, the
    rotary and the routing choices all move the logits well above the tolerance, while the
    logits stay O(1) (where fp32 rounding is ~1e-7, far below the tolerance)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            else:  # fan-in scaling: unit-scale activations, router logits and LM logits
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def random_hf(model_cfg, router_cfg, attn: str = "eager", experts_impl: str | None = None, seed: int = 0):
    torch.manual_seed(seed)
    hf = MixtralForCausalLM(mixtral_config(with_variants(model_cfg, router_cfg), attn_implementation=attn))
    if experts_impl is not None:
        hf.set_experts_implementation(experts_impl)
    randomize_(hf, seed)
    return hf.eval()


def input_ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 300, (B, T), generator=torch.Generator().manual_seed(seed))


def assert_logits_match(ours: Transformer, hf: MixtralForCausalLM) -> None:
    ids = input_ids()
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
        got = ours(ids).logits
    assert expected.dtype == got.dtype == torch.float32
    assert expected.std() > 0.5  # the comparison is not between near-zero logits
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


# ------------------------------------------------------------------ logits: HF -> ours

@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("hf_attn", ["eager", "sdpa"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("experts", ["sorted", "loop"])
def test_hf_weights_in_our_model_give_hf_logits(case, hf_attn, attention, experts):
    model_cfg, router_cfg = make_cfgs(**CASES[case])
    hf = random_hf(model_cfg, router_cfg, attn=hf_attn)
    ours = Transformer(with_variants(model_cfg, router_cfg, attention=attention, experts=experts)).eval()
    from_hf_state_dict(hf.state_dict(), ours)
    assert_logits_match(ours, hf)


@pytest.mark.parametrize("experts_impl", ["eager", "grouped_mm", "batched_mm"])
def test_every_hf_experts_implementation_matches(experts_impl):
    model_cfg, router_cfg = make_cfgs(**CASES["top2-gqa-untied"])
    hf = random_hf(model_cfg, router_cfg, experts_impl=experts_impl)
    ours = from_hf_model(hf)
    assert_logits_match(ours, hf)


def test_from_hf_model_uses_hf_config_and_weights():
    model_cfg, router_cfg = make_cfgs(**CASES["top1-gqa-untied-headdim"])
    hf = random_hf(model_cfg, router_cfg, attn="sdpa")
    ours = from_hf_model(hf, attention="eager", experts="loop")
    assert not ours.training
    assert ours.cfg == with_variants(dataclasses.replace(model_cfg, init_std=hf.config.initializer_range),
                                     router_cfg, "eager", "loop")
    assert_logits_match(ours, hf)


# ------------------------------------------------------------------ logits: ours -> HF

@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("hf_attn", ["eager", "sdpa"])
def test_our_weights_in_hf_give_our_logits(case, hf_attn):
    model_cfg, router_cfg = make_cfgs(**CASES[case])
    torch.manual_seed(0)
    ours = Transformer(with_variants(model_cfg, router_cfg))
    randomize_(ours, seed=3)
    ours.eval()
    hf = to_hf_model(ours, attn_implementation=hf_attn)
    assert not hf.training
    assert hf.config._attn_implementation == hf_attn
    assert (hf.lm_head.weight is hf.model.embed_tokens.weight) == model_cfg.tie_embeddings
    assert_logits_match(ours, hf)


def test_to_hf_model_keeps_dtype():
    model_cfg, router_cfg = make_cfgs(**CASES["top2-gqa-untied"])
    ours = Transformer(with_variants(model_cfg, router_cfg)).to(torch.bfloat16)
    hf = to_hf_model(ours)
    assert {p.dtype for p in hf.parameters()} == {torch.bfloat16}
    back = from_hf_model(hf)
    assert {p.dtype for p in back.parameters()} == {torch.bfloat16}
    assert back.rotary.cos.dtype == torch.float32


# ------------------------------------------------------------------ state dicts

@pytest.mark.parametrize("case", list(CASES))
def test_state_dict_round_trip_is_exact(case):
    model_cfg, router_cfg = make_cfgs(**CASES[case])
    torch.manual_seed(0)
    ours = Transformer(with_variants(model_cfg, router_cfg))
    hf_sd = to_hf_state_dict(ours)
    # Exactly HF's parameter names and shapes.
    reference = MixtralForCausalLM(mixtral_config(with_variants(model_cfg, router_cfg))).state_dict()
    assert {k: v.shape for k, v in hf_sd.items()} == {k: v.shape for k, v in reference.items()}

    torch.manual_seed(1)
    copy = Transformer(with_variants(model_cfg, router_cfg))
    from_hf_state_dict(hf_sd, copy)
    original, loaded = ours.state_dict(), copy.state_dict()
    assert original.keys() == loaded.keys()
    for key in original:
        assert torch.equal(original[key], loaded[key]), key
    assert (copy.lm_head.weight is copy.embed.weight) == model_cfg.tie_embeddings

    # And HF -> ours -> HF.
    hf = random_hf(model_cfg, router_cfg, seed=5)
    again = to_hf_state_dict(from_hf_state_dict(hf.state_dict(), copy))
    for key, value in hf.state_dict().items():
        assert torch.equal(again[key], value), key


def test_tied_lm_head_may_be_absent_but_not_different():
    model_cfg, router_cfg = make_cfgs(**CASES["top1-mha-tied"])
    hf_sd = dict(to_hf_state_dict(Transformer(with_variants(model_cfg, router_cfg))))
    target = Transformer(with_variants(model_cfg, router_cfg))
    head = hf_sd.pop("lm_head.weight")
    from_hf_state_dict(hf_sd, target)  # saved checkpoints drop the tied copy
    assert torch.equal(target.lm_head.weight, hf_sd["model.embed_tokens.weight"])
    hf_sd["lm_head.weight"] = head + 1
    with pytest.raises(ValueError, match="lm_head.weight differs"):
        from_hf_state_dict(hf_sd, target)


def test_state_dict_mismatches_are_all_listed():
    model_cfg, router_cfg = make_cfgs(**CASES["top2-gqa-untied"])
    model = Transformer(with_variants(model_cfg, router_cfg))
    hf_sd = dict(to_hf_state_dict(model))
    del hf_sd["model.layers.1.self_attn.k_proj.weight"]
    hf_sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(8)
    hf_sd["model.layers.0.mlp.gate.weight"] = torch.zeros(7, 64)
    with pytest.raises(ValueError) as err:
        from_hf_state_dict(hf_sd, model)
    msg = str(err.value)
    assert "missing keys (1): model.layers.1.self_attn.k_proj.weight" in msg
    assert "unexpected keys (1): model.layers.0.self_attn.rotary_emb.inv_freq" in msg
    assert "model.layers.0.mlp.gate.weight: checkpoint (7, 64) vs model (6, 64)" in msg
    hf_sd = dict(to_hf_state_dict(model))
    del hf_sd["lm_head.weight"]  # untied: required
    with pytest.raises(ValueError, match="missing keys .*lm_head.weight"):
        from_hf_state_dict(hf_sd, model)


# ------------------------------------------------------------------ configs

def test_mixtral_config_mapping():
    model_cfg, router_cfg = make_cfgs(**CASES["top1-gqa-untied-headdim"])
    c = mixtral_config(with_variants(model_cfg, router_cfg), bos_token_id=1, eos_token_id=2, pad_token_id=0)
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (300, 64, 48, 2)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (4, 1, 8)
    assert c.max_position_embeddings == 32 and c.rope_parameters["rope_theta"] == 500.0
    assert c.rope_parameters["rope_type"] == "default"
    assert c.rms_norm_eps == 1e-6 and c.tie_word_embeddings is False
    assert (c.num_local_experts, c.num_experts_per_tok, c.router_aux_loss_coef) == (6, 1, 0.01)
    assert c.router_jitter_noise == 0 and c.sliding_window is None and c.attention_dropout == 0
    assert c.hidden_act == "silu"
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (1, 2, 0)
    # Not Mixtral's 1/2 unless the caller says so.
    plain = mixtral_config(with_variants(model_cfg, router_cfg))
    assert (plain.bos_token_id, plain.eos_token_id, plain.pad_token_id) == (None, None, None)
    # Saved and reloaded (config.json), it still maps back.
    assert model_config_from_hf(MixtralConfig.from_dict(c.to_dict())) == model_config_from_hf(c)


def test_config_round_trip():
    for case in CASES.values():
        model_cfg, router_cfg = make_cfgs(**case)
        assert model_config_from_hf(mixtral_config(with_variants(model_cfg, router_cfg))) == \
            with_variants(model_cfg, router_cfg)


def test_extra_may_not_override_derived_fields():
    with pytest.raises(ConfigError, match="hidden_size"):
        mixtral_config(with_variants(*make_cfgs(**CASES["top2-gqa-untied"])), hidden_size=128)


@pytest.mark.parametrize("section, option, value", [
    ("model", "n_shared_experts", 1),
    ("model", "n_dense_layers", 1),
    ("router", "renormalize", False),
    ("router", "temperature", 2.0),
    ("router", "n_groups", 2),
    ("router", "capacity_factor", 1.25),
])
def test_mixtral_config_refuses_what_mixtral_cannot_express(section, option, value):
    model_cfg, router_cfg = make_cfgs(**CASES["top2-gqa-untied"])
    if section == "model":
        model_cfg = dataclasses.replace(model_cfg, **{option: value})
    else:
        router_cfg = dataclasses.replace(router_cfg, **{option: value})
    with pytest.raises(ConfigError, match=f"{section}.{option}={value!r}"):
        mixtral_config(with_variants(model_cfg, router_cfg))
    if section == "model" and option == "n_shared_experts" or section == "router":
        model = Transformer(with_variants(model_cfg, router_cfg))  # the state dict conversions refuse it too
        with pytest.raises(ConfigError, match=f"{section}.{option}"):
            to_hf_state_dict(model)


def test_mixtral_config_refuses_other_routers():
    model_cfg, router_cfg = make_cfgs(**CASES["top2-gqa-untied"])
    with pytest.raises(ConfigError, match="router.name='sinkhorn'"):
        mixtral_config(with_variants(model_cfg, router_config("sinkhorn", top_k=router_cfg.top_k)))


def test_mixtral_config_needs_a_vocab_size():
    model_cfg, router_cfg = make_cfgs(**CASES["top2-gqa-untied"])
    with pytest.raises(ConfigError, match="model.vocab_size=None"):
        mixtral_config(with_variants(dataclasses.replace(model_cfg, vocab_size=None), router_cfg))


@pytest.mark.parametrize("option, value", [
    ("hidden_act", "gelu"),
    ("router_jitter_noise", 0.1),
    ("attention_dropout", 0.1),
    ("rope_parameters", {"rope_type": "longrope", "rope_theta": 500.0, "factor": 2.0}),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0, "beta_fast": 8, "bogus": 1}),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5}),
])
def test_model_config_from_hf_refuses_what_we_cannot_run(option, value):
    c = mixtral_config(with_variants(*make_cfgs(**CASES["top2-gqa-untied"])))
    setattr(c, option, value)
    name = {"rope_parameters": "rope_"}.get(option, option)
    with pytest.raises(ConfigError, match=name):
        model_config_from_hf(c)


# ------------------------------------------------------------------ the other families, in memory

@pytest.mark.parametrize("case", ["olmoe-tied-renorm", "qwen2-mha-tied-mlponly", "qwen3-headdim-mlponly"])
def test_in_memory_conversion_both_ways(case):
    hf = random_hf_model(case, seed=7)
    ours = from_hf_model(hf, attention="eager", experts="loop")
    back = to_hf_model(ours, hf.config.model_type, attn_implementation="eager")
    assert type(back) is type(hf)
    ids = family_ids(2, 11, 5)
    with torch.no_grad():
        a, b, c = hf(input_ids=ids).logits, ours(ids).logits, back(input_ids=ids).logits
    assert (a - b).abs().max().item() <= ATOL and torch.equal(a, c)
    assert model_config_from_hf(back.config, attention="eager", experts="loop") == ours.cfg


def test_from_hf_model_builds_on_meta_and_copies_in_hf_dtype(monkeypatch):
    """No parameter of ours is initialised off the meta device; the weights arrive in HF's dtype
    as copies (HF's model is left as it was)."""
    seen = []
    real = torch.nn.init.normal_
    monkeypatch.setattr(torch.nn.init, "normal_",
                        lambda *a, **k: (seen.append((a[0] if a else k["tensor"]).is_meta), real(*a, **k))[1])
    hf = random_hf_model("qwen3-headdim-mlponly", seed=3).to(torch.bfloat16)
    seen.clear()
    ours = from_hf_model(hf, attention="eager", experts="loop")
    assert seen and all(seen)
    assert {p.dtype for p in ours.parameters()} == {torch.bfloat16} and ours.rotary.cos.dtype == torch.float32
    emb = hf.model.embed_tokens.weight
    assert torch.equal(ours.embed.weight, emb) and ours.embed.weight.data_ptr() != emb.data_ptr()


@pytest.mark.parametrize("case,scaling", [
    ("mixtral-mha-tied", None),
    ("qwen3-headdim-mlponly", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
    ("olmoe-tied-renorm", {"rope_type": "linear", "factor": 2.0}),
])
def test_to_hf_model_builds_on_meta_and_computes_hf_buffers(monkeypatch, case, scaling):
    """No HF weight is initialised off the meta device (HF's random init would be overwritten by the
    copy); the buffers HF computes (rotary inv_freq, original_inv_freq, with RoPE scaling) equal those
    of HF's own plain build of the same config; tied weights are one tensor; logits equal ours."""
    ours = from_hf_model(random_hf_model(case, seed=5), attention="eager", experts="loop")
    if scaling is not None:
        ours = Transformer(dataclasses.replace(ours.cfg, rope_scaling=scaling)).eval()
        ours.load_state_dict(from_hf_model(random_hf_model(case, seed=5), attention="eager",
                                           experts="loop").state_dict())
    seen = []
    for name in ("normal_", "uniform_", "kaiming_uniform_", "trunc_normal_", "zeros_", "ones_"):
        real = getattr(torch.nn.init, name)
        monkeypatch.setattr(torch.nn.init, name, lambda *a, _real=real, **k: (
            seen.append((a[0] if a else k["tensor"]).is_meta), _real(*a, **k))[1])
    back = to_hf_model(ours, family_of(case), attn_implementation="eager")
    monkeypatch.undo()
    assert all(seen)  # HF's init ran (if at all) on meta tensors only
    plain = type(back)(back.config)  # HF's own build: its random init and its buffers
    computed = dict(plain.named_non_persistent_buffers())
    assert computed and sorted(computed) == sorted(n for n, _ in back.named_non_persistent_buffers())
    for name, buf in back.named_non_persistent_buffers():
        assert torch.equal(buf, computed[name]), name
    assert not any(t.is_meta for t in [*back.parameters(), *back.buffers()])
    if back.config.tie_word_embeddings:
        assert back.lm_head.weight is back.model.embed_tokens.weight
    ids = family_ids(2, 11, 5)
    with torch.no_grad():
        assert (back(input_ids=ids).logits - ours(ids).logits).abs().max().item() <= ATOL


def family_of(case: str) -> str:
    from tests.hf_fixtures import CASES as HF_CASES
    return HF_CASES[case][0]
