"""End-to-end engine tests: greedy generation must equal, token for token, a naive loop that
re-runs the whole model on the whole sequence (no cache) for every token, whatever the
batching, chunking, preemption and prefix caching did on the way."""

import pytest
import torch

from moe.engine import LLM, SamplingParams
from moe.loading import load_model

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
LENGTHS = [1, 5, 16, 17, 33, 47]  # 1 token, block multiples (16) and not


def check_exact(llm, model, prompts, naive, params=GREEDY):
    outs = llm.generate(prompts, params)
    for p, o in zip(prompts, outs):
        assert o.error is None, o.error
        assert o.finish_reason == "length"
        assert o.token_ids == naive(model, p, params.max_tokens), f"prompt of {len(p)} tokens diverged"
    return outs


@pytest.mark.parametrize("opts", [
    dict(),  # big pool, prefix caching on
    dict(enable_prefix_caching=False),
    dict(max_num_batched_tokens=8),  # every prompt but the shortest is prefilled in chunks
    dict(max_num_seqs=2, max_num_batched_tokens=24),
], ids=["default", "no-prefix-cache", "chunked", "few-seqs"])
def test_greedy_equals_naive(model, naive, make_prompts, opts):
    llm = LLM.from_model(model, None, **opts)
    check_exact(llm, model, make_prompts(LENGTHS), naive)
    s = llm.stats()
    assert s["kv_blocks_used"] == 0 and s["num_running"] == 0 and s["num_waiting"] == 0
    assert s["generation_tokens"] == len(LENGTHS) * GREEDY.max_tokens
    assert s["prompt_tokens_computed"] == sum(LENGTHS)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preemption_keeps_outputs_exact(model, naive, make_prompts, prefix_caching):
    # 5 blocks of 16 slots: the first four prompts fill them, and growing needs a preemption
    llm = LLM.from_model(model, None, num_blocks=5, enable_prefix_caching=prefix_caching)
    check_exact(llm, model, make_prompts(LENGTHS), naive)
    s = llm.stats()
    assert s["num_preemptions"] > 0
    assert s["kv_blocks_used"] == 0


def test_prefix_cache_hits_are_exact(model, naive, make_prompts):
    shared = make_prompts([40], seed=1)[0]
    prompts = [shared + tail for tail in make_prompts([3, 9, 1, 20], seed=2)]
    # a small budget admits the first prompt alone; the others then hit its cached blocks
    llm = LLM.from_model(model, None, max_num_batched_tokens=40)
    check_exact(llm, model, prompts, naive)
    s = llm.stats()
    assert s["prefix_cache_hit_rate"] > 0.4
    assert s["prefix_cache_hits"] == 3 * 32  # 2 full blocks of the shared 40 tokens, 3 prompts
    # a second call hits the blocks the first one released (prompt 1's third block is its own)
    outs = check_exact(llm, model, prompts[:2], naive)
    assert [o.metrics.num_cached_prompt_tokens for o in outs] == [32, 48]


def test_everything_at_once(model, naive, make_prompts):
    shared = make_prompts([20], seed=3)[0]
    prompts = make_prompts(LENGTHS, seed=4) + [shared + t for t in make_prompts([2, 30, 13], seed=5)]
    llm = LLM.from_model(model, None, num_blocks=9, block_size=8, max_num_seqs=4, max_num_batched_tokens=11)
    check_exact(llm, model, prompts, naive, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    s = llm.stats()
    assert s["num_preemptions"] > 0 and s["prefix_cache_hits"] > 0


def test_triton_backend_end_to_end(model, naive, make_prompts):
    from kernels import paged_attention as pa
    if pa.runnable_reason(torch.device("cpu")) is not None:  # no triton, or no TRITON_INTERPRET=1
        pytest.skip("needs triton with TRITON_INTERPRET=1 (the model here is on CPU)")
    a, b, c = make_prompts([18, 4, 3], seed=6)
    prompts = [a, a[:16] + b, c]  # the second one extends the first one's cached block
    # one sequence at a time, chunks of 10: chunked prefill, decode, and an extend over a cached prefix
    llm = LLM.from_model(model, None, attention_backend="triton", max_num_seqs=1, max_num_batched_tokens=10)
    check_exact(llm, model, prompts, naive, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert llm.stats()["prefix_cache_hits"] == 16
    # two at a time in a pool of 3 blocks: preemption
    llm = LLM.from_model(model, None, attention_backend="triton", num_blocks=3, max_num_seqs=2)
    check_exact(llm, model, [a, c], naive, SamplingParams(temperature=0, max_tokens=15, ignore_eos=True))
    assert llm.stats()["num_preemptions"] > 0


def test_per_sequence_prefill_path_is_exact(model, naive, make_prompts, monkeypatch):
    from moe.attention.paged_torch import TorchPagedAttention
    monkeypatch.setattr(TorchPagedAttention, "max_padded_scores", 0)  # every prefill takes the SDPA loop
    llm = LLM.from_model(model, None, max_num_batched_tokens=20)
    check_exact(llm, model, make_prompts(LENGTHS), naive)


def test_bf16_runs(make_model, make_prompts):
    m = make_model(260).to(torch.bfloat16)
    llm = LLM.from_model(m, None)
    outs = llm.generate(make_prompts([4, 20]), SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [5, 5] and llm.runner.context.kv.dtype == torch.bfloat16


def test_seeded_sampling_independent_of_batch_and_preemption(model, make_prompts):
    prompts = make_prompts([10, 30, 25, 7], seed=7)
    p = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=42, max_tokens=15, ignore_eos=True)
    alone = LLM.from_model(model, None).generate(prompts[0], p)[0].token_ids
    crowded = LLM.from_model(model, None, num_blocks=5, max_num_batched_tokens=9)
    outs = crowded.generate(prompts, [p] + [SamplingParams(temperature=1.0, max_tokens=15)] * 3)
    assert crowded.stats()["num_preemptions"] > 0
    assert outs[0].token_ids == alone


# ---------------------------------------------------------------------------- stopping

def test_stop_token_ids_eos_and_ignore_eos(model, naive, make_prompts, tokenizer_cls):
    prompt = make_prompts([9], seed=8)[0]
    ref = naive(model, prompt, 12)
    stop_tok = ref[4]
    first = ref.index(stop_tok)
    llm = LLM.from_model(model, tokenizer_cls(eos_id=stop_tok))
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12))[0]
    assert out.token_ids == ref[:first + 1] and out.finish_reason == "stop" and out.stop_reason == stop_tok
    assert out.text == tokenizer_cls().decode(ref[:first])  # the stop token adds no text
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert out.token_ids == ref and out.finish_reason == "length"
    out = LLM.from_model(model, tokenizer_cls()).generate(
        prompt, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_tok]))[0]
    assert out.token_ids == ref[:first + 1] and out.finish_reason == "stop"


def test_max_tokens_and_max_model_len(model, naive, make_prompts):
    prompt = make_prompts([30], seed=9)[0]
    llm = LLM.from_model(model, None, max_model_len=36)
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    assert out.finish_reason == "length" and out.token_ids == naive(model, prompt, 6)
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]
    assert len(out.token_ids) == 3 and out.finish_reason == "length"


def _stop_string(text):
    for i in range(1, len(text) - 2):
        s = text[i:i + 2]
        if "\ufffd" not in s and s.strip():
            return s
    return None


def test_stop_strings_and_streaming(bpe_model, bpe_tok):
    llm = LLM.from_model(bpe_model, bpe_tok)
    prompts = ["the quick brown", "héllo wörld", "日本", "experts route"]
    base = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    texts = [bpe_tok.decode(o.token_ids) for o in base]
    assert [o.text for o in base] == texts
    stops = [_stop_string(t) for t in texts]
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[s] if s else None)
              for s in stops]
    outs = llm.generate(prompts, params)
    deltas = {i: "" for i in range(len(prompts))}
    finished = []
    for ev in llm.stream(prompts, params):
        deltas[ev.index] += ev.text_delta
        if ev.finished:
            finished.append(ev.index)
            assert ev.output.text == deltas[ev.index]
    assert sorted(finished) == list(range(len(prompts)))
    for i, (o, t, s) in enumerate(zip(outs, texts, stops)):
        assert deltas[i] == o.text
        if s is None:
            continue
        assert o.text == t[:t.index(s)] and o.finish_reason == "stop" and o.stop_reason == s
        assert base[i].token_ids[:len(o.token_ids)] == o.token_ids


def test_streaming_multibyte_text_never_shows_partial_chars(model, tokenizer_cls):
    # the byte tokenizer splits every non-ASCII character over several tokens
    tok = tokenizer_cls()
    llm = LLM.from_model(model, tok)
    texts = {0: "", 1: ""}
    for ev in llm.stream(["naïve 日本"] * 2, SamplingParams(temperature=0.9, seed=1, max_tokens=30,
                                                           ignore_eos=True)):
        texts[ev.index] += ev.text_delta
        if not ev.finished:
            assert "\ufffd" not in ev.text_delta[-1:]
        else:
            assert texts[ev.index] == ev.output.text == tok.decode(ev.output.token_ids)


# ---------------------------------------------------------------------------- streams, chat, stats

def test_closing_a_stream_aborts_its_requests(model, make_prompts):
    llm = LLM.from_model(model, None)
    it = llm.stream(make_prompts([5, 6]), GREEDY)
    next(it)
    it.close()
    assert not llm.has_unfinished_requests() and llm.stats()["kv_blocks_used"] == 0


def test_chat(bpe_model, bpe_tok):
    llm = LLM.from_model(bpe_model, bpe_tok)
    conv = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the quick brown fox"}]
    p = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    out = llm.chat(conv, p)
    assert len(out) == 1 and out[0].prompt == bpe_tok.apply_chat_template(conv, add_generation_prompt=True)
    direct = llm.generate(out[0].prompt, p)[0]
    assert out[0].token_ids == direct.token_ids
    outs = llm.chat([conv, [{"role": "wizard", "content": "x"}], conv[1:]], p)
    assert [o.finish_reason for o in outs] == ["length", "error", "length"] and "role" in outs[1].error


def test_metrics_logprobs_and_stats(model, make_prompts):
    llm = LLM.from_model(model, None)
    outs = llm.generate(make_prompts([7, 20]), SamplingParams(temperature=0, max_tokens=6, logprobs=3,
                                                               ignore_eos=True))
    for o in outs:
        m = o.metrics
        assert m.ttft > 0 and m.first_token_time >= m.first_scheduled_time >= m.arrival_time
        assert len(m.token_times) == 6 and m.tpot is not None and m.e2e_latency >= m.ttft
        assert len(o.logprobs) == 6
        for tok, lp in zip(o.token_ids, o.logprobs):
            assert tok in lp and len(lp) == 3 and lp[tok] == max(lp.values())  # greedy = the top one
    s = llm.stats()
    assert s["num_steps"] >= 6 and s["kv_blocks_total"] == llm.num_blocks
    assert 0 < s["moe/token_entropy_norm"] <= 1
    loads = s["moe/expert_load"]
    assert len(loads) == 2 and all(abs(sum(row) - 1) < 1e-6 for row in loads)
    assert "moe/layer0/load_max" in s
    llm.reset_stats()
    assert llm.stats()["num_steps"] == 0 and "moe/expert_load" not in llm.stats()


# ---------------------------------------------------------------------------- checkpoint + CLI

def test_checkpoint_and_cli(tmp_path, bpe_model, bpe_tok, capsys):
    ckpt_mod = pytest.importorskip("moe.checkpoint")
    from moe.config import Config, to_dict
    cfg = Config(model=bpe_model.cfg)
    path = ckpt_mod.save_checkpoint(tmp_path / "step_0000001.pt", {
        "model": bpe_model.state_dict(), "config": to_dict(cfg),
        "tokenizer": ckpt_mod.tokenizer_files(bpe_tok)})
    p = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    expected = LLM.from_model(bpe_model, bpe_tok).generate("héllo", p)[0].text
    assert LLM(str(path)).generate("héllo", p)[0].text == expected

    from moe.generate import main
    assert main([str(path), "--prompt", "héllo", "--max-tokens", "10", "--temperature", "0",
                 "--ignore-eos"]) == 0
    assert capsys.readouterr().out == expected + "\n"
    assert main([str(path), "--prompt", "a", "--prompt", "b", "--max-tokens", "3"]) == 0
    assert "=== [1]" in capsys.readouterr().out
    assert main([str(path), "--prompt", "", "--max-tokens", "3"]) == 1
    assert "empty" in capsys.readouterr().err


def test_the_engine_serves_an_hf_directory_rerouted(hf_dirs):
    directory, _ = hf_dirs("qwen2-step2-headdim")
    routing = {"top_k": 1, "drop_experts": [2]}
    llm = LLM(str(directory), routing=routing, device="cpu", dtype="fp32", block_size=4, num_blocks=64)
    assert type(llm.tokenizer).__name__ == "HFTokenizer" and llm.model.cfg.router.top_k == 1
    prompt = [5, 9, 14, 3, 7, 30]
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    model, _, _ = load_model(directory, routing=routing)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(6):  # the naive reference: the whole sequence every step
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert out.token_ids == ids[len(prompt):]
    loads = torch.tensor(llm.stats()["moe/expert_load"])
    assert loads.shape == (1, 4) and (loads[:, 2] == 0).all() and (loads.sum(-1) > 0.99).all()  # 1 MoE layer of 3
    chat = llm.chat([{"role": "user", "content": "hi w1"}], SamplingParams(temperature=0.0, max_tokens=3))
    assert len(chat[0].token_ids) == 3
