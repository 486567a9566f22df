"""RoPE scaling (moe/rope.py) against transformers' own `ROPE_INIT_FUNCTIONS`, the model's
rotary tables against HF's rotary embedding, and the context checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import MixtralConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.mixtral.modeling_mixtral import MixtralRotaryEmbedding

from moe.config import ModelConfig, check_context, validate_model
from moe.errors import ConfigError
from moe.model import Rotary, Transformer
from moe.rope import rope_parameters

HEAD_DIM, MAX_POS, THETA = 64, 4096, 500000.0
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.5},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn-deepseek-mscale": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                             "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1},
    "yarn-attention-factor-untruncated": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
                                          "attention_factor": 1.3, "truncate": False},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 1024},
}


def ours(scaling: dict, max_pos: int = MAX_POS, theta: float = THETA) -> ModelConfig:
    return ModelConfig(d_model=HEAD_DIM * 4, n_heads=4, n_kv_heads=2, max_seq_len=max_pos, rope_theta=theta,
                       rope_scaling=dict(scaling) or None, vocab_size=32)


def theirs(scaling: dict, max_pos: int = MAX_POS, theta: float = THETA) -> MixtralConfig:
    return MixtralConfig(hidden_size=HEAD_DIM * 4, num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM,
                         max_position_embeddings=max_pos, rope_parameters={**scaling, "rope_theta": theta})


def llama3_at_the_low_wavelength_boundary() -> dict:
    """llama3 with low_freq_factor chosen so that one dim's wavelength equals original / low_freq_factor
    exactly (in fp32, where the comparison happens): rules out `>=` for `>` in either of the rule's
    two comparisons with the low-frequency wavelength (that dim would be scaled by factor twice, or not at all)."""
    import math
    inv_freq = 1.0 / (THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.int64).float() / HEAD_DIM))
    wavelen = float((2 * math.pi / inv_freq)[HEAD_DIM // 4])
    low = 1024 / wavelen
    assert torch.tensor(1024 / low, dtype=torch.float32) == torch.tensor(wavelen, dtype=torch.float32)
    return {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": low, "high_freq_factor": 4 * low,
            "original_max_position_embeddings": 1024}


# Cases that tell plausible slips apart (each would pass with every case above):
SEPARATING = {
    # yarn at factor 1 is the plain rotary (mscale 1, not the 0.1 ln(s) + 1 branch's value at s <= 1)
    "yarn-factor1": ({"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 4096}, THETA),
    # a factor below 1 (accepted, as by HF, which only warns): mscale stays 1 for every s <= 1, not
    # 0.1 ln(s) + 1 < 1 (rules out a shortcut taken at s == 1 only)
    "yarn-factor-below-1": ({"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 4096}, THETA),
    # factor 2 (the mscale branch for 1 < s <= 2) and non-default betas (32 / 1 would hide a wrong key)
    "yarn-factor2-betas": ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 2048,
                            "beta_fast": 16, "beta_slow": 2}, THETA),
    # unequal mscale / mscale_all_dim (equal ones cancel: 0.1 * m vs 0.1 / m would not show)
    "yarn-mscale-ratio": ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
                           "mscale": 0.8, "mscale_all_dim": 0.4}, THETA),
    # mscale alone is ignored by HF (the ratio needs both): rules out "either one"
    "yarn-mscale-alone": ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
                           "mscale": 0.707}, THETA),
    # beta_fast == beta_slow untruncated: the ramp has zero width (high += 0.001 in HF)
    "yarn-zero-width-ramp": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                              "beta_fast": 4, "beta_slow": 4, "truncate": False}, THETA),
    # a small theta and a large beta_fast: the ramp's ends clamp to 0 and dim - 1 (both bounds used)
    "yarn-clamped-ramp": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
                           "beta_fast": 1000, "beta_slow": 1}, 10.0),
    # low_freq_factor != 1 (original * low vs original / low would agree at 1)
    "llama3-low-freq-2": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
                           "original_max_position_embeddings": 1024}, THETA),
    "llama3-boundary": (llama3_at_the_low_wavelength_boundary(), THETA),
}


@pytest.mark.parametrize("case", list(SEPARATING))
def test_separating_cases_match_hf(case):
    scaling, theta = SEPARATING[case]
    cfg = ours(scaling, theta=theta)
    inv_freq, attention = rope_parameters(cfg, torch.device("cpu"))
    ref_freq, ref_attention = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](theirs(scaling, theta=theta), "cpu")
    torch.testing.assert_close(inv_freq, ref_freq.float(), rtol=1e-6, atol=0)
    assert attention == pytest.approx(ref_attention, rel=1e-6)


@pytest.mark.parametrize("case", list(SCALINGS))
def test_inverse_frequencies_and_attention_scaling_match_hf(case):
    cfg = ours(SCALINGS[case])
    inv_freq, scaling = rope_parameters(cfg, torch.device("cpu"))
    # HF's dynamic type depends on the current length: ours is fixed at the whole extended context
    ref_freq, ref_scaling = ROPE_INIT_FUNCTIONS[SCALINGS[case]["rope_type"]](theirs(SCALINGS[case]), "cpu",
                                                                             seq_len=cfg.max_context)
    assert inv_freq.dtype == torch.float32 and inv_freq.shape == (HEAD_DIM // 2,)
    torch.testing.assert_close(inv_freq, ref_freq.float(), rtol=1e-6, atol=0)
    assert scaling == pytest.approx(ref_scaling, rel=1e-6)
    default = 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2).double() / HEAD_DIM)  # the unscaled formula
    assert not torch.allclose(inv_freq.double(), default, rtol=1e-3)  # the scaling did something


@pytest.mark.parametrize("case", ["yarn", "llama3", "linear", "dynamic"])
def test_rotary_tables_match_hf_rotary_embedding(case):
    """cos / sin of our tables at positions up to the extended context against MixtralRotaryEmbedding's
    (which applies the attention scaling too); dynamic compared at a batch that reaches max_context."""
    cfg = ours(SCALINGS[case], max_pos=512)
    rot = Rotary(cfg)
    assert rot.cos.shape == (cfg.max_context, HEAD_DIM) and rot.cos.dtype == torch.float32
    hf = MixtralRotaryEmbedding(theirs(SCALINGS[case], max_pos=512))
    pos = torch.arange(cfg.max_context)[None]
    cos_ref, sin_ref = hf(torch.zeros(1, dtype=torch.float32), pos)
    cos, sin = rot(pos)
    torch.testing.assert_close(cos, cos_ref, atol=2e-5, rtol=0)  # fp32 position x frequency products
    torch.testing.assert_close(sin, sin_ref, atol=2e-5, rtol=0)


def test_max_context_is_factor_times_the_original_length():
    assert ours({}).max_context == MAX_POS
    assert ours(SCALINGS["linear"]).max_context == int(2.5 * MAX_POS)
    assert ours(SCALINGS["yarn"]).max_context == MAX_POS  # 4 x 1024 = the declared max_position_embeddings
    assert ours(SCALINGS["yarn"], max_pos=1024).max_context == 4096  # Qwen3's form: factor x original
    assert ours(SCALINGS["llama3"]).max_context == 8 * 1024


def test_forward_is_a_pure_gather_past_the_trained_length_only_with_scaling():
    plain = ours({}, max_pos=64)
    with pytest.raises(ConfigError, match=r"max_model_len=65 is beyond model.max_seq_len=64 .* model.rope_scaling"):
        check_context("max_model_len", 65, plain)
    check_context("max_model_len", 64, plain)
    scaled = ours(SCALINGS["linear"], max_pos=64)
    check_context("max_model_len", 160, scaled)
    with pytest.raises(ConfigError, match=r"max_model_len=161 is beyond the 160 tokens model.rope_scaling"):
        check_context("max_model_len", 161, scaled)
    rot = Rotary(plain)
    with pytest.raises(ConfigError, match="position 64 is beyond the 64 positions"):
        rot(torch.tensor([[3, 64]]))
    with pytest.warns(UserWarning, match="max_model_len=100 exceeds the model's context 64 .allowed explicitly"):
        check_context("max_model_len", 100, plain, allow=True)  # the engine's allow_long_context
    cos63 = rot.cos[63].clone()
    rot.extend(100)  # what the engine then does: longer tables, the same values where they overlap
    assert rot.cos.shape[0] == 100 and torch.equal(rot.cos[63], cos63) and rot(torch.tensor([99]))[0].shape == (1, HEAD_DIM)
    model = Transformer(dataclasses.replace(plain, n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, n_experts=2,
                                            expert_hidden=8))
    with pytest.raises(ConfigError, match="65 tokens is longer than the model's context 64"):
        model(torch.zeros(1, 65, dtype=torch.long))


@pytest.mark.parametrize("scaling, match", [
    ({"rope_type": "ntk"}, r"model.rope_scaling.rope_type='ntk' is not allowed; choose one of \['linear', 'dynamic'"),
    ({"rope_type": "yarn", "factor": 4.0}, r"needs \['factor', 'original_max_position_embeddings'\].*missing"),
    ({"rope_type": "linear", "factor": 2.0, "beta_fast": 3}, r"unknown \['beta_fast'\]"),
    ({"rope_type": "linear", "factor": 0.5}, r"model.rope_scaling.factor=0.5 must be >= 1"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
      "original_max_position_embeddings": 8192}, "low_freq_factor=4.0 must be < high_freq_factor=1.0"),
])
def test_bad_rope_scaling_names_the_field(scaling, match):
    with pytest.raises(ConfigError, match=match):
        validate_model(ours(scaling))
