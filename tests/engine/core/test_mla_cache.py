"""The latent paged KV cache of Multi-head Latent Attention (moe/engine/runner/context.py's latent
layout, moe/attention/mla.py's absorbed form): one row of kv_lora_rank + qk_rope_head_dim values
per token and layer, and engine log-probabilities equal to a full fp32 forward of the model (no
cache, the expanded attention) with prefix caching, chunked prefill, preemption, speculative
decoding and quantized weights; the FP8 cache close to it. Odd sizes (latent 10 + rope 4, 4
heads) so no width is a power of two; q_lora_rank both None (V2-Lite) and set, and DeepSeek's
YaRN softmax scale."""

import copy

import pytest
import torch

from moe.engine import LLM, SamplingParams
from moe.engine.runner.context import KVLayout, PagedKVContext
from tests.engine.core.test_logprob_parity import BS, check_parity, parity_prompts

MLA = dict(attention_kind="mla", n_heads=4, n_kv_heads=4, head_dim=None, kv_lora_rank=10, qk_nope_head_dim=6,
           qk_rope_head_dim=4, v_head_dim=8, n_shared_experts=1, n_dense_layers=1)
YARN = {"rope_type": "yarn", "factor": 2.0, "mscale": 0.7, "mscale_all_dim": 0.7,
        "original_max_position_embeddings": 128}


def attention_heavy_mla(model):
    """Queries and nope keys scaled by 3 (scores x9), as test_logprob_parity does for plain attention: the
    next token then depends on which earlier tokens are attended, so a wrong latent shows in the log-probs."""
    with torch.no_grad():
        for block in model.layers:
            attn = block.attn
            (attn.q_proj if attn.q_proj is not None else attn.q_b_proj).weight.mul_(3.0)
            attn.kv_b_proj.weight.view(attn.n_heads, attn.nope + attn.v_dim, -1)[:, :attn.nope].mul_(3.0)
    return model


@pytest.fixture(scope="module")
def mla_q_lora(make_model):
    return attention_heavy_mla(make_model(260, seed=5, q_lora_rank=12, **MLA))


@pytest.fixture(scope="module")
def mla_plain_q(make_model):
    """V2-Lite's shape: one query projection; with DeepSeek's YaRN mscale on the softmax scale."""
    return attention_heavy_mla(make_model(260, seed=6, q_lora_rank=None, rope_scaling=YARN, **MLA))


def test_the_cache_holds_one_latent_row_per_token_and_layer(mla_q_lora):
    cfg = mla_q_lora.cfg
    assert KVLayout.of(cfg) == KVLayout(1, 14, latent=True)
    llm = LLM.from_model(mla_q_lora, None, block_size=BS, num_blocks=32, attention_backend="torch")
    ctx = llm.runner.context
    assert ctx.k_caches[0].shape == (32, BS, 1, 14) and ctx.v_caches[0] is ctx.k_caches[0]
    assert ctx.kv.numel() == cfg.n_layers * 32 * BS * 14  # nothing else allocated
    assert llm.kv_bytes_per_token == cfg.n_layers * 14 * 4  # fp32
    expanded = PagedKVContext.bytes_per_block(cfg.n_layers, BS, cfg.n_kv_heads, cfg.resolved_head_dim, torch.float32)
    assert llm.kv_bytes_per_token * BS * 4 < expanded  # vs K and V per head: 2 x 4 x 10 values a layer
    fp8 = PagedKVContext.model_bytes_per_block(cfg, BS, torch.bfloat16, "fp8_e4m3")
    assert fp8 == cfg.n_layers * BS * (14 + 4)  # one E4M3 row and its fp32 scale


OPTS = {
    "prefix-cache": dict(),
    "chunked": dict(max_num_batched_tokens=7),  # chunks end inside blocks, interleaved with decodes
    "preemption": dict(num_blocks=5, max_num_batched_tokens=64),
}


@pytest.mark.parametrize("opts", OPTS.values(), ids=OPTS.keys())
def test_logprobs_equal_a_full_forward(mla_q_lora, make_prompts, opts):
    llm = LLM.from_model(mla_q_lora, None, block_size=BS, attention_backend="torch", **opts)
    prompts = parity_prompts(make_prompts)
    check_parity(llm, mla_q_lora, prompts[:1])  # a alone first: its blocks are then in the prefix cache
    check_parity(llm, mla_q_lora, prompts)
    s = llm.stats()
    if "num_blocks" in opts:
        assert s["num_preemptions"] > 0
    else:
        assert s["prefix_cache_hits"] >= 2 * BS


def test_plain_query_projection_and_yarn_scale(mla_plain_q, make_prompts):
    llm = LLM.from_model(mla_plain_q, None, block_size=BS, attention_backend="torch", max_num_batched_tokens=9)
    check_parity(llm, mla_plain_q, parity_prompts(make_prompts)[:4])


@pytest.mark.parametrize("spec", [{"method": "ngram", "num_tokens": 3}, {"method": "self", "top_k": 1}],
                         ids=["ngram", "self"])
def test_speculative_decoding(mla_q_lora, make_prompts, spec):
    """Prompts p + (p's greedy continuation g) + p: the continuation repeats g, which ngram proposes."""
    plain = LLM.from_model(mla_q_lora, None, block_size=BS, attention_backend="torch")
    prompts = parity_prompts(make_prompts)[:3]
    greedy = [o.token_ids for o in plain.generate(prompts, SamplingParams(temperature=0, max_tokens=5,
                                                                          ignore_eos=True))]
    llm = LLM.from_model(mla_q_lora, None, block_size=BS, attention_backend="torch", speculative=spec)
    check_parity(llm, mla_q_lora, [p + g + p for p, g in zip(prompts, greedy)])
    assert llm.stats()["spec_proposed"] > 0


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_quantized_weights(mla_q_lora, make_prompts, scheme):
    """Quantized weights (kv_b_proj too: the absorbed form uses its dequantised weight; fp8 = W8A8, whose
    activation rounding of kv_b_proj's input goes into the cached latent) vs the quantized model's own
    full forward."""
    llm = LLM.from_model(copy.deepcopy(mla_q_lora), None, quantization=scheme, block_size=BS,
                         attention_backend="torch")
    assert type(llm.model.layers[0].attn.kv_b_proj).__name__ == "QuantLinear"
    check_parity(llm, llm.model, parity_prompts(make_prompts)[:3])


def test_fp8_latent_cache(mla_q_lora, make_prompts):
    """E4M3 latent rows (one scale per token): close to the full forward, not equal (it is FP8)."""
    llm = LLM.from_model(mla_q_lora, None, block_size=BS, attention_backend="torch", kv_cache_dtype="fp8_e4m3")
    assert llm.runner.context.fp8.codes.shape[1:] == (1, llm.num_blocks, BS, 1, 14)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=0)
    prompts = parity_prompts(make_prompts)[:3]
    with pytest.raises(AssertionError, match="worst"):  # FP8 is not exact ...
        check_parity(llm, mla_q_lora, prompts, params, tol=1e-6)
    check_parity(llm, mla_q_lora, prompts, params, tol=0.1)  # ... but close


def test_mtp_speculative_decoding(make_model, make_prompts):
    """DeepSeek-V3's own drafter: the MTP module's MLA block has a latent cache of its own."""
    model = attention_heavy_mla(make_model(260, seed=7, q_lora_rank=12, mtp_depth=1, **MLA))
    llm = LLM.from_model(model, None, block_size=BS, attention_backend="torch", speculative={"method": "mtp"})
    assert llm.spec is not None
    check_parity(llm, model, parity_prompts(make_prompts)[:3])
    assert llm.stats()["spec_proposed"] > 0


def test_a_wide_latent_on_the_cuda_triton_kernels_is_refused_naming_both():
    """kernels/mla_decode's compile check: the generic Triton kernels need more shared memory than sm_90
    has at V2-Lite / V3's width 576, so the engine refuses at creation instead of failing at launch."""
    from types import SimpleNamespace

    from moe.attention import PAGED_BACKENDS
    from moe.errors import ConfigError

    cfg = SimpleNamespace(attention_kind="mla", kv_lora_rank=512, qk_rope_head_dim=64, n_layers=1)
    with pytest.raises(ConfigError, match=r"attention_backend='triton'.*model.attention_kind='mla'.*576"):
        PagedKVContext.for_model(cfg, 4, BS, torch.bfloat16, torch.device("cuda"), PAGED_BACKENDS.get("triton")())
    ctx = PagedKVContext.for_model(cfg, 4, BS, torch.float32, torch.device("cpu"), PAGED_BACKENDS.get("torch")())
    assert ctx.k_caches[0].shape == (4, BS, 1, 576)
