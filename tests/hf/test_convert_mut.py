"""moe/hf/convert.py's defaults, messages and edge cases (the sixth mutation run,
docs/results/mutation/run6_mutH/): what test_convert.py's round trips do not pin down — the
default family and backends, each refusal's exact text, a lone unexpected key, a tied head
given in another dtype, a model of mixed dtypes, and a shape-only (meta) model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moe.errors import ConfigError
from moe.hf.convert import (check_mixtral_compatible, from_hf_model, from_hf_state_dict, hf_config, infer_family,
                            mixtral_config, model_config_from_hf, to_hf_model, to_hf_state_dict)
from moe.model import Transformer
from moe.routing.routers import router_config
from tests.conftest import tiny_model_config, with_variants


def _cfg(**kw):
    return with_variants(tiny_model_config(**kw), router_config(top_k=2, z_loss_coef=0.0))


def test_infer_family_lists_every_familys_reason():
    cfg = with_variants(tiny_model_config(), router_config("sinkhorn", top_k=2))
    with pytest.raises(ConfigError) as err:
        infer_family(cfg)
    msg = str(err.value)
    assert msg.startswith("no HF family can express this model:\n  mixtral: ")
    lines = msg.split("\n  ")
    assert [line.split(":")[0] for line in lines[1:]] == ["mixtral", "qwen3_moe", "olmoe", "qwen2_moe", "gpt_oss",
                                                          "deepseek_v2", "deepseek_v3"]
    assert all("router.name='sinkhorn'" in line for line in lines[1:])


def test_hf_config_defaults_to_mixtral_and_keeps_the_base_fields():
    cfg = _cfg()
    c = hf_config(cfg)
    assert c.model_type == "mixtral" and c.bos_token_id is None
    c = hf_config(cfg, base={"bos_token_id": 7, "eos_token_id": 8}, pad_token_id=3)
    assert (c.model_type, c.bos_token_id, c.eos_token_id, c.pad_token_id) == ("mixtral", 7, 8, 3)


def test_model_config_from_hf_refuses_an_unknown_model_type_by_name():
    from transformers import LlamaConfig
    with pytest.raises(ConfigError) as err:
        model_config_from_hf(LlamaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1,
                                         num_attention_heads=4, intermediate_size=16))
    msg = str(err.value)
    assert msg.startswith("model_type='llama' is not a family moe-lab converts; choose one of [")
    assert "'mixtral'" in msg and "'gpt_oss'" in msg and "'deepseek_v3'" in msg


def test_the_default_backends_are_sdpa_and_sorted():
    cfg = model_config_from_hf(hf_config(_cfg()))
    assert (cfg.attention.name, cfg.experts.name) == ("sdpa", "sorted")
    torch.manual_seed(0)
    hf = to_hf_model(Transformer(_cfg()))  # the default family: Mixtral
    assert hf.config.model_type == "mixtral"
    back = from_hf_model(hf)
    assert (back.cfg.attention.name, back.cfg.experts.name) == ("sdpa", "sorted")
    assert to_hf_state_dict(back).keys() == hf.state_dict().keys()  # default family and layout: memory


def test_a_lone_unexpected_key_or_two_missing_keys_are_listed_exactly():
    torch.manual_seed(0)
    model = Transformer(_cfg())
    hf_sd = dict(to_hf_state_dict(model))
    hf_sd["model.extra.weight"] = torch.zeros(1)
    with pytest.raises(ValueError) as err:
        from_hf_state_dict(hf_sd, model)
    assert str(err.value) == ("HF mixtral state dict does not match the model:\n  "
                              "unexpected keys (1): model.extra.weight")
    del hf_sd["model.extra.weight"], hf_sd["model.norm.weight"], hf_sd["lm_head.weight"]
    hf_sd["model.embed_tokens.weight"] = torch.zeros(3, 32)
    with pytest.raises(ValueError) as err:
        from_hf_state_dict(hf_sd, model)
    assert str(err.value) == ("HF mixtral state dict does not match the model:\n  "
                              "missing keys (2): lm_head.weight, model.norm.weight\n  "
                              "shape mismatches (1): model.embed_tokens.weight: checkpoint (3, 32) vs model (97, 32)")


def test_a_tied_head_is_compared_in_the_embeddings_dtype_and_refused_by_its_message():
    torch.manual_seed(0)
    model = Transformer(_cfg(tie_embeddings=True))
    hf_sd = {k: v.clone() for k, v in to_hf_state_dict(model).items()}
    hf_sd["lm_head.weight"] = hf_sd["model.embed_tokens.weight"].double()  # equal values, another dtype
    target = Transformer(_cfg(tie_embeddings=True))
    from_hf_state_dict(hf_sd, target)
    assert torch.equal(target.lm_head.weight, model.embed.weight)
    hf_sd["lm_head.weight"] = hf_sd["lm_head.weight"] + 1
    with pytest.raises(ValueError) as err:
        from_hf_state_dict(hf_sd, target)
    assert str(err.value) == ("lm_head.weight differs from model.embed_tokens.weight, but the model ties them "
                              "(tie_embeddings=True); convert with tie_embeddings=False")


def test_from_hf_model_casts_every_weight_to_the_first_parameters_dtype():
    torch.manual_seed(0)
    hf = to_hf_model(Transformer(_cfg()))
    hf.model.norm.to(torch.float64)  # one module in another dtype
    ours = from_hf_model(hf)
    assert {p.dtype for p in ours.parameters()} == {torch.float32}
    assert torch.equal(ours.norm.weight, hf.model.norm.weight.float())


def test_to_hf_model_of_a_meta_model_is_a_meta_model():
    """A shape-only model (e.g. for planning) converts without memory: HF's model stays on meta."""
    with torch.device("meta"):
        ours = Transformer(_cfg())
    hf = to_hf_model(ours)
    assert all(p.is_meta for p in hf.parameters())
    assert {k: v.shape for k, v in hf.state_dict().items()} == \
        {k: v.shape for k, v in to_hf_state_dict(ours).items()}


def test_check_mixtral_compatible_names_the_option_and_passes_a_mixtral_model():
    check_mixtral_compatible(_cfg())  # no error
    with pytest.raises(ConfigError, match="model.n_shared_experts=1"):
        check_mixtral_compatible(_cfg(n_shared_experts=1))
    assert mixtral_config(_cfg(), bos_token_id=4).bos_token_id == 4


def _qwen3():
    from tests.hf_fixtures import random_hf_model
    return random_hf_model("qwen3-headdim-mlponly", seed=2)


def test_the_asked_family_backends_and_options_are_used():
    hf = _qwen3()
    assert model_config_from_hf(hf.config, attention="eager", experts="loop").attention.name == "eager"
    assert model_config_from_hf(hf.config, attention="eager", experts="loop").experts.name == "loop"
    ours = from_hf_model(hf, attention="eager", experts="loop")
    assert (ours.cfg.attention.name, ours.cfg.experts.name) == ("eager", "loop")
    back = to_hf_model(ours, "qwen3_moe", attn_implementation="eager")
    assert back.config.model_type == "qwen3_moe" and back.config._attn_implementation == "eager"
    plain = type(back)(back.config)  # HF's own build computes the non-persistent buffers (rotary inv_freq)
    buffers = dict(plain.named_non_persistent_buffers())
    assert buffers and all(torch.equal(b, buffers[n]) for n, b in back.named_non_persistent_buffers())
    fresh = from_hf_model(hf, attention="eager", experts="loop")
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    from_hf_state_dict(hf.state_dict(), fresh, "qwen3_moe")
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), ours.state_dict().values()))
    half = to_hf_model(ours.to(torch.bfloat16), "qwen3_moe")
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}


def test_a_tied_head_in_another_precision_is_checked_and_skipped_in_the_embeddings_dtype():
    """A bf16 embedding and an fp32 copy of the head that rounds to it: accepted (compared in the
    embedding's dtype), and the head is not copied over the tied weight; absent, it is not missed."""
    torch.manual_seed(0)
    model = Transformer(_cfg(tie_embeddings=True))
    hf_sd = {k: v.detach().clone() for k, v in to_hf_state_dict(model).items()}
    embed = hf_sd["model.embed_tokens.weight"].to(torch.bfloat16)
    hf_sd["model.embed_tokens.weight"] = embed
    head = embed.float() * (1 + 2.0 ** -12)  # not a bf16 value, rounds back to the embedding
    assert not torch.equal(head, embed.float()) and torch.equal(head.to(torch.bfloat16), embed)
    hf_sd["lm_head.weight"] = head
    target = Transformer(_cfg(tie_embeddings=True))
    from_hf_state_dict(hf_sd, target)
    assert torch.equal(target.lm_head.weight, embed.float()) and target.lm_head.weight is target.embed.weight
    del hf_sd["lm_head.weight"]
    from_hf_state_dict(hf_sd, target)  # tied: the head may be absent


def test_an_untied_head_is_loaded_whatever_it_holds():
    torch.manual_seed(0)
    model = Transformer(_cfg())
    hf_sd = {k: v.detach().clone() for k, v in to_hf_state_dict(model).items()}
    hf_sd["lm_head.weight"] = hf_sd["model.embed_tokens.weight"] + 1
    target = Transformer(_cfg())
    from_hf_state_dict(hf_sd, target)
    assert torch.equal(target.lm_head.weight, hf_sd["lm_head.weight"])
    assert torch.equal(target.embed.weight, hf_sd["model.embed_tokens.weight"])
