"""Multi-head Latent Attention in the model (`model.attention_kind=mla`, moe/attention/mla.py): its
config checks (one error naming both fields), training with every router and expert dispatch and
with activation checkpointing, DeepSeek's YaRN softmax scale, the interleaved rotary, and the engine's
latent paged path (greedy = a naive full recompute; more in tests/engine/core/test_mla_cache.py).
HF parity: tests/hf (the deepseek fixtures)."""

from __future__ import annotations

import math

import pytest
import torch

from moe.attention import ATTENTION_BACKENDS
from moe.attention.mla import rotate, yarn_softmax_mscale
from moe.config import load_config
from moe.errors import ConfigError
from moe.model import Transformer
from moe.routing.routers import ROUTERS

MLA = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, n_experts=4, expert_hidden=16,
           max_seq_len=64, attention_kind="mla", q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6,
           qk_rope_head_dim=4, v_head_dim=8, n_shared_experts=1, n_dense_layers=1, routed_scaling_factor=1.5)


def mla_model(router: str = "topk", experts: str = "sorted", seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    raw = {"model": {**MLA, **kw}, "router": {"name": router, "top_k": 2 if router != "switch" else 1},
           "experts": {"name": experts}, "train": {"seq_len": 32}}
    return Transformer(load_config(raw).model)


@pytest.mark.parametrize("change, words", [
    (dict(n_kv_heads=2), ["model.attention_kind='mla'", "model.n_kv_heads=2"]),
    (dict(sliding_window=8), ["model.attention_kind='mla'", "model.sliding_window=8"]),
    (dict(attention_sinks=True), ["model.attention_kind='mla'", "model.attention_sinks=true"]),
    (dict(head_dim=8), ["model.attention_kind='mla'", "model.head_dim=8"]),
    (dict(attention_kind="mha"), ["model.q_lora_rank=12", "model.attention_kind='mha'"]),
    (dict(kv_lora_rank=None), ["model.kv_lora_rank=None"]),
    (dict(qk_rope_head_dim=5), ["model.qk_rope_head_dim=5", "even"]),
])
def test_options_mla_cannot_take_are_one_error_naming_both(change, words):
    with pytest.raises(ConfigError) as e:
        load_config({"model": {**MLA, **change}, "train": {"seq_len": 32}})
    assert all(w in str(e.value) for w in words), str(e.value)


def test_flash_attention_with_mla_names_both_fields():
    with pytest.raises(ConfigError, match=r"model.attention_kind='mla' cannot take attention=flash"):
        load_config({"model": MLA, "attention": {"name": "flash"}, "train": {"seq_len": 32}})


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_a_training_step_with_every_router(router):
    model = mla_model(router).train()
    ids = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(1))
    out = model(ids, labels=ids)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    attn = model.layers[1].attn
    for p in (attn.q_a_proj.weight, attn.kv_a_proj.weight, attn.kv_b_proj.weight, attn.kv_a_norm.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0


@pytest.mark.parametrize("experts", ["loop", "sorted", "sorted_fused"])
def test_every_dispatch_gives_the_same_loss(experts):
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(2))
    losses = [mla_model(experts=name)(ids, labels=ids).loss for name in ("loop", experts)]
    assert torch.allclose(losses[0], losses[1], atol=1e-5)


def test_activation_checkpointing_gives_the_same_gradients():
    from moe.train.activation_checkpointing import apply_activation_checkpointing

    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
    grads = []
    for mode in ("none", "full"):
        model = mla_model(q_lora_rank=None).train()
        assert apply_activation_checkpointing(model, mode) == (0 if mode == "none" else 2)
        model(ids, labels=ids).loss.backward()
        grads.append(model.layers[0].attn.q_proj.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_eager_and_sdpa_agree_with_unequal_qk_and_v_widths():
    ids = torch.randint(0, 64, (2, 13), generator=torch.Generator().manual_seed(4))
    eager, sdpa = mla_model(), mla_model()
    for block in eager.layers:
        block.attn.backend = ATTENTION_BACKENDS.get("eager")()
    with torch.no_grad():
        assert torch.allclose(eager(ids).logits, sdpa(ids).logits, atol=1e-5)


def test_yarn_softmax_scale_is_deepseeks():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    s = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
         "mscale_all_dim": 1.0}
    assert yarn_softmax_mscale(s) == pytest.approx(yarn_apply_mscale(s, 1.0), rel=1e-12)
    assert yarn_softmax_mscale(s) == pytest.approx((0.1 * math.log(40) + 1) ** 2)
    assert yarn_softmax_mscale({**s, "mscale_all_dim": None}) == 1.0 and yarn_softmax_mscale(None) == 1.0


def test_interleaved_rotary_is_hfs():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave

    g = torch.Generator().manual_seed(5)
    x, angles = torch.randn(2, 3, 5, 8, generator=g), torch.randn(2, 5, 4, generator=g)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    expected, _ = apply_rotary_pos_emb_interleave(x, x, cos, sin)
    assert torch.allclose(rotate(x, cos, sin, interleave=True), expected, atol=1e-6)


def test_the_mla_tiny_config_builds_an_mla_model():
    from omegaconf import OmegaConf
    from pathlib import Path

    raw = OmegaConf.to_container(OmegaConf.load(Path(__file__).parents[2] / "configs/model/mla_tiny.yaml"))
    model = Transformer(load_config({"model": {**raw, "vocab_size": 64}}).model)
    assert type(model.layers[0].attn).__name__ == "MultiHeadLatentAttention"
    assert model.cfg.resolved_head_dim == 48 and model.cfg.rotary_dim == 16  # cache width: nope + rope > v


@pytest.mark.parametrize("kw", [dict(), dict(q_lora_rank=None, rope_interleave=True, v_head_dim=14,
                                              rope_scaling={"rope_type": "yarn", "factor": 2.0, "mscale": 0.7,
                                                            "original_max_position_embeddings": 32,
                                                            "mscale_all_dim": 0.7})])
def test_engine_greedy_equals_a_naive_recompute(kw, bpe_tokenizer, tmp_path):
    """The engine's latent paged cache (absorbed attention) on an HF DeepSeek checkpoint."""
    from moe.engine import LLM, SamplingParams
    from moe.loading import load_model
    from tests.hf_fixtures import family_checkpoint

    model_kw = {k: v for k, v in MLA.items() if k not in ("vocab_size", "max_seq_len")}
    path = family_checkpoint(tmp_path, bpe_tokenizer, **{**model_kw, **kw})
    model, _, _ = load_model(path)
    prompts = [torch.randint(4, 300, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (9, 3)]
    llm = LLM(str(path), device="cpu", dtype="fp32", block_size=4, num_blocks=64)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(8):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        assert out.token_ids == ids[len(prompt):]
