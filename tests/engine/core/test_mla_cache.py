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


def test_a_wide_latent_builds_for_the_triton_backend():
    """kernels/mla_decode serves DeepSeek's width 576 (the generic Triton kernels did not fit sm_90's
    shared memory there, so this was refused): a context of that width is built for `triton`."""
    from types import SimpleNamespace

    from moe.attention import PAGED_BACKENDS

    cfg = SimpleNamespace(attention_kind="mla", kv_lora_rank=512, qk_rope_head_dim=64, n_layers=1)
    for backend in ("triton", "torch"):
        ctx = PagedKVContext.for_model(cfg, 4, BS, torch.float32, torch.device("cpu"), PAGED_BACKENDS.get(backend)())
        assert ctx.latent and ctx.k_caches[0].shape == (4, BS, 1, 576)


@pytest.fixture
def prefill_form(mla_q_lora, monkeypatch):
    """Force one prefill form on every MLA layer, and count the steps that ran each form."""
    from moe.attention import mla_paged

    calls = {"expanded": 0, "absorbed": 0}

    def counting(name, fn):
        def wrapped(*args, **kw):
            calls[name] += 1
            return fn(*args, **kw)
        return wrapped

    monkeypatch.setattr(mla_paged, "expanded_paged_prefill", counting("expanded", mla_paged.expanded_paged_prefill))
    monkeypatch.setattr(mla_paged, "absorbed_paged_prefill", counting("absorbed", mla_paged.absorbed_paged_prefill))

    def force(form):
        for block in mla_q_lora.layers:
            monkeypatch.setattr(block.attn, "prefill_form", form)
        return calls
    return force


@pytest.mark.parametrize("form", ["expanded", "absorbed"])
@pytest.mark.parametrize("opts", [OPTS["prefix-cache"], OPTS["chunked"]], ids=["prefix-cache", "chunked"])
def test_both_prefill_forms_equal_a_full_forward(mla_q_lora, make_prompts, prefill_form, opts, form):
    """Prefills with a cached prefix (prefix-cache hits, later chunks) in the expanded form (the
    cached latents expanded per head) and in the absorbed form both give the full forward's
    log-probs, so each equals the other and a fresh prefill; only the forced form ran."""
    calls = prefill_form(form)
    llm = LLM.from_model(mla_q_lora, None, block_size=BS, attention_backend="torch", **opts)
    prompts = parity_prompts(make_prompts)
    check_parity(llm, mla_q_lora, prompts[:1])
    check_parity(llm, mla_q_lora, prompts)
    assert llm.stats()["prefix_cache_hits"] >= 2 * BS
    other = "absorbed" if form == "expanded" else "expanded"
    assert calls[form] > 0 and calls[other] == 0


def test_the_triton_mla_kernel_serves_the_engine(mla_q_lora, make_prompts, prefill_form, monkeypatch):
    """attention_backend='triton' (the interpreter on CPU): decode through kernels/mla_decode, long
    prefills expanded, short chunks absorbed (the kernel with a row per query), equal to the full forward."""
    from moe.attention import mla_paged

    calls = prefill_form("auto")
    kernel_rows, kernel = [], mla_paged.mla_decode

    def counting(q_latent, *args):
        kernel_rows.append(q_latent.shape[0])
        return kernel(q_latent, *args)
    monkeypatch.setattr(mla_paged, "mla_decode", counting)
    llm = LLM.from_model(mla_q_lora, None, block_size=BS, attention_backend="triton", max_num_batched_tokens=30)
    check_parity(llm, mla_q_lora, parity_prompts(make_prompts)[:2])
    assert calls["expanded"] > 0 and calls["absorbed"] > 0 and len(kernel_rows) > 0
