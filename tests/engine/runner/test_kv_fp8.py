"""The FP8 KV cache (moe/engine/runner/kv_fp8.py): storage against a plain per-token loop, the compact
dequantised view against the whole cache, and the engine against the full-precision cache
(greedy agreement rate and logprobs before the first disagreement)."""

import torch

from kernels.paged_attention import paged_attention_decode_torch
from moe.engine import LLM, SamplingParams
from moe.engine.runner.kv_fp8 import FP8KVCache, fp8_bytes_per_block
from tests.engine.conftest import build_model, random_prompts


def test_write_matches_a_per_token_per_head_loop():
    cache = FP8KVCache(n_layers=2, num_blocks=4, block_size=4, n_kv_heads=3, head_dim=8, device=torch.device("cpu"))
    k, v = torch.randn(6, 3, 8) * 5, torch.randn(6, 3, 8)
    slots = torch.tensor([0, 5, 6, -1, 15, 9])
    cache.write(1, k, v, slots)
    k_all, v_all = cache.dequantized(1)
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        for h in range(3):
            for x, got in ((k, k_all), (v, v_all)):
                s = x[t, h].abs().max() / 448
                ref = (x[t, h] / s).to(torch.float8_e4m3fn).float() * s
                torch.testing.assert_close(got.view(-1, 3, 8)[slot, h], ref)
    assert float(k_all.abs().sum()) > 0 and float(k_all.view(-1, 3, 8)[3].abs().sum()) == 0  # slot -1 skipped
    assert fp8_bytes_per_block(2, 4, 3, 8) * 2 < 2 * 2 * 4 * 3 * 8 * 4  # under half of fp32


def test_compact_view_attends_like_the_whole_cache():
    cache = FP8KVCache(1, 8, 4, 2, 16, torch.device("cpu"))
    cache.write(0, torch.randn(32, 2, 16), torch.randn(32, 2, 16), torch.arange(32))
    tables = torch.tensor([[5, 2, 7], [1, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([11, 3], dtype=torch.int32)
    q = torch.randn(2, 4, 16)
    k_all, v_all = cache.dequantized(0)
    k_c, v_c, (t_c,) = cache.compact(0, [tables], torch.float32)
    assert k_c.shape[0] == 5  # blocks 0, 1, 2, 5, 7 only
    torch.testing.assert_close(paged_attention_decode_torch(q, k_c, v_c, t_c, lens, 0.25),
                               paged_attention_decode_torch(q, k_all, v_all, tables, lens, 0.25))


def test_engine_fp8_cache_against_full_precision():
    model = build_model(260, d_model=64, n_heads=4, n_kv_heads=2)
    prompts = random_prompts([5, 17, 30, 9, 40, 12])
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=5)
    outs = {}
    for kv in ("auto", "fp8_e4m3"):
        llm = LLM.from_model(model, None, kv_cache_dtype=kv, num_blocks=64, block_size=8, collect_routing_stats=False)
        outs[kv] = llm.generate(prompts, params)
        stats = llm.stats()
        assert stats["kv_cache_dtype"] == kv
        outs[kv + "_bytes"] = stats["kv_bytes_per_token"]
    # fp32 model, d = 16: 4 bytes per element vs 1 + 4/16
    assert outs["auto_bytes"] == 2 * 2 * 2 * 16 * 4 and outs["fp8_e4m3_bytes"] == 2 * 2 * 2 * (16 + 4)
    agree = total = 0
    worst = 0.0
    for ref, got in zip(outs["auto"], outs["fp8_e4m3"]):
        for i, (a, b) in enumerate(zip(ref.token_ids, got.token_ids)):
            total += 1
            if a != b:
                break  # after a disagreement the histories differ: no more comparisons
            agree += 1
            common = set(ref.logprobs[i]) & set(got.logprobs[i])
            worst = max(worst, max(abs(ref.logprobs[i][t] - got.logprobs[i][t]) for t in common))
    rate = agree / total
    print(f"fp8 KV cache: greedy agreement {agree}/{total} = {rate:.3f}, max |dlogprob| {worst:.4f}")
    assert rate >= 0.9
    assert worst < 0.05  # stated tolerance on the log-probabilities while histories agree
