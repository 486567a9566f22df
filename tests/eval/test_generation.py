"""`run_requests` over the real engine: greedy outputs equal a plain argmax loop over the model,
follow-up requests join while others still run, failed requests come back (not raised), and
`engine_stats` keeps the scalar counters."""

from __future__ import annotations

import pytest
import torch

from eval.generation import engine_stats, run_requests
from moe.engine import LLM, RequestOutput, SamplingParams


@torch.no_grad()
def greedy_reference(model, prompt: list[int], max_tokens: int, stop_ids: set[int]) -> list[int]:
    """One full forward per new token, no KV cache: what the engine must reproduce greedily."""
    out: list[int] = []
    while len(out) < max_tokens:
        tok = int(model(torch.tensor([prompt + out])).logits[0, -1].argmax())
        out.append(tok)
        if tok in stop_ids:
            break
    return out


def chat_prompts(tok, texts):
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}])) for t in texts]


def test_greedy_outputs_equal_a_plain_argmax_loop(tiny):
    model, tok, _ = tiny
    llm = LLM.from_model(model, tok, max_model_len=128)
    prompts = chat_prompts(tok, ("Tell me a story.", "Who is Lily?", "Once upon a time"))
    params = SamplingParams(max_tokens=6, temperature=0.0, stop_token_ids=[tok.eos_id])
    outs = run_requests(llm, [(i, p, params) for i, p in enumerate(prompts)])
    assert sorted(outs) == [0, 1, 2] and all(isinstance(o, RequestOutput) for o in outs.values())
    for i, p in enumerate(prompts):
        ref = greedy_reference(model, p, 6, {tok.eos_id})
        o = outs[i]
        assert o.token_ids == ref and o.prompt_token_ids == p
        assert o.finish_reason == ("stop" if ref[-1] == tok.eos_id else "length")
        assert o.text == tok.decode(ref[:-1] if o.finish_reason == "stop" else ref)


def test_follow_ups_join_the_running_batch_at_once(tiny):
    """A short request's follow-up is submitted when it finishes and finishes itself before a
    long request submitted together with the first one: no barrier between rounds."""
    model, tok, _ = tiny
    llm = LLM.from_model(model, tok, max_model_len=128)
    short = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    follow = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    long = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    finished = []

    def on_finish(key, out):
        finished.append(key)
        return [("short-2", out.prompt_token_ids + out.token_ids, follow)] if key == "short" else None

    outs = run_requests(llm, [("short", [5, 6, 7], short), ("long", [8, 9], long)], on_finish)
    assert finished == ["short", "short-2", "long"] and set(outs) == set(finished)
    assert [len(outs[k].token_ids) for k in finished] == [1, 2, 12]
    assert outs["short-2"].prompt_token_ids == [5, 6, 7] + outs["short"].token_ids
    stats = engine_stats(llm)
    assert stats["generation_tokens"] == 15 and stats["num_running"] == 0
    assert "moe/expert_load" in llm.stats() and "moe/expert_load" not in stats  # per-layer lists left out
    assert all(isinstance(v, (int, float)) for v in stats.values())


def test_a_failed_request_comes_back_with_its_error(tiny):
    model, tok, _ = tiny
    llm = LLM.from_model(model, tok, max_model_len=32)
    params = SamplingParams(max_tokens=4, temperature=0.0)
    outs = run_requests(llm, [("ok", [5, 6], params), ("too-long", list(range(5, 45)), params)])
    assert outs["ok"].finish_reason in ("stop", "length") and outs["ok"].token_ids
    bad = outs["too-long"]
    assert bad.finish_reason == "error" and bad.token_ids == [] and "max_model_len" in bad.error


def test_an_engine_that_loses_requests_is_an_error():
    class IdleEngine:
        def add_request(self, ids, params):
            return "req-0"

        def step(self):
            return []

        def has_unfinished_requests(self):
            return False

    with pytest.raises(RuntimeError, match="1 request"):
        run_requests(IdleEngine(), [("x", [1], SamplingParams(max_tokens=1))])
