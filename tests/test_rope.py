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


def ours(scaling: dict, max_pos: int = MAX_POS) -> ModelConfig:
    return ModelConfig(d_model=HEAD_DIM * 4, n_heads=4, n_kv_heads=2, max_seq_len=max_pos, rope_theta=THETA,
                       rope_scaling=dict(scaling) or None, vocab_size=32)


def theirs(scaling: dict, max_pos: int = MAX_POS) -> MixtralConfig:
    return MixtralConfig(hidden_size=HEAD_DIM * 4, num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM,
                         max_position_embeddings=max_pos, rope_parameters={**scaling, "rope_theta": THETA})


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
