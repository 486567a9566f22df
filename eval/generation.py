"""Generation for the evaluations: the inference engine (`moe.engine.LLM`) behind a small
submit/poll interface, so dependent requests (MT-Bench's turn 2, built from the model's own
turn-1 answer) join the running batch as soon as their turn 1 finishes (continuous batching
across turns, no barrier between them).

FALLBACK: if `moe.engine` cannot be imported, `NaiveGenerator` is used instead: a plain loop
over the model without a KV cache (one full forward per new token, requests one at a time),
with the same sampling rules for temperature 0 (argmax) and for temperature/top-p. It exists
only so that the evaluations still run while the engine is missing; it is slow and is never
used when the engine imports.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

log = logging.getLogger("moe.eval")


@dataclass
class GenParams:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: Optional[int] = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False


@dataclass
class GenOutput:
    tag: Any
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens (a final stop token included)
    text: str  # decoded, stop tokens left out
    finish_reason: str  # stop | length | error
    error: Optional[str] = None
    ttft_s: Optional[float] = None
    e2e_s: Optional[float] = None


class EngineGenerator:
    """`moe.engine.LLM` over an in-memory model."""

    name = "engine"

    def __init__(self, model, tokenizer, max_model_len: int, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 2048, seed: int = 0):
        from moe.engine import LLM

        self.llm = LLM.from_model(model, tokenizer, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=max_num_batched_tokens, seed=seed)
        self.tokenizer = tokenizer
        self._tags: dict[str, Any] = {}

    def submit(self, tag: Any, prompt_ids: list[int], p: GenParams) -> None:
        from moe.engine import SamplingParams

        sp = SamplingParams(temperature=float(p.temperature), top_p=float(p.top_p), seed=p.seed,
                            max_tokens=int(p.max_tokens), stop_token_ids=list(p.stop_token_ids) or None,
                            ignore_eos=p.ignore_eos)
        rid = self.llm.add_request(list(prompt_ids), sp)
        self._tags[rid] = tag

    def pending(self) -> int:
        return len(self._tags)

    def poll(self) -> list[GenOutput]:
        """Run one engine step; the requests that finished in it."""
        done = []
        for ev in self.llm.step():
            if not ev.finished or ev.request_id not in self._tags:
                continue
            o = ev.output
            m = o.metrics
            done.append(GenOutput(self._tags.pop(ev.request_id), list(o.prompt_token_ids), list(o.token_ids), o.text,
                                  o.finish_reason, o.error, m.ttft if m else None, m.e2e_latency if m else None))
        if not done and self._tags and not self.llm.has_unfinished_requests():
            raise RuntimeError(f"the engine is idle but {len(self._tags)} request(s) never finished")
        return done

    def stats(self) -> dict:
        s = self.llm.stats()
        return {k: v for k, v in s.items() if isinstance(v, (int, float))}


class NaiveGenerator:
    """FALLBACK ONLY (no `moe.engine`): no KV cache, one request at a time."""

    name = "naive-fallback"

    def __init__(self, model, tokenizer, max_model_len: int, seed: int = 0, **_):
        self.model, self.tokenizer, self.max_model_len = model, tokenizer, max_model_len
        self.queue: list[tuple[Any, list[int], GenParams]] = []
        self.seed = seed
        self.eos_id = getattr(tokenizer, "eos_id", None)
        self._tokens = 0

    def submit(self, tag: Any, prompt_ids: list[int], p: GenParams) -> None:
        self.queue.append((tag, list(prompt_ids), p))

    def pending(self) -> int:
        return len(self.queue)

    @torch.no_grad()
    def poll(self) -> list[GenOutput]:
        if not self.queue:
            return []
        tag, ids, p = self.queue.pop(0)
        t0 = time.perf_counter()
        device = next(self.model.parameters()).device
        g = torch.Generator(device=device).manual_seed(p.seed if p.seed is not None else self.seed)
        out: list[int] = []
        reason, ttft = "length", None
        if len(ids) >= self.max_model_len:
            return [GenOutput(tag, ids, [], "", "error", f"the prompt has {len(ids)} tokens but max_model_len is "
                              f"{self.max_model_len}")]
        while len(out) < p.max_tokens and len(ids) + len(out) < self.max_model_len:
            logits = self.model(torch.tensor([ids + out], device=device)).logits[0, -1].float()
            if p.temperature == 0:
                tok = int(logits.argmax())
            else:
                probs = torch.softmax(logits / p.temperature, dim=-1)
                if p.top_p < 1:
                    sp, order = probs.sort(descending=True)
                    before = sp.cumsum(0) - sp
                    sp = sp.masked_fill(before >= p.top_p, 0)
                    probs = torch.zeros_like(probs).scatter(0, order, sp)
                tok = int(torch.multinomial(probs / probs.sum(), 1, generator=g))
            ttft = ttft if ttft is not None else time.perf_counter() - t0
            out.append(tok)
            self._tokens += 1
            if (not p.ignore_eos and tok == self.eos_id) or tok in p.stop_token_ids:
                reason = "stop"
                break
        text_ids = out[:-1] if reason == "stop" else out
        return [GenOutput(tag, ids, out, self.tokenizer.decode(text_ids), reason, None, ttft,
                          time.perf_counter() - t0)]

    def stats(self) -> dict:
        return {"generation_tokens": self._tokens}


def make_generator(model, tokenizer, max_model_len: int, max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
                   seed: int = 0):
    try:
        import moe.engine  # noqa: F401
    except ImportError as e:
        log.warning("moe.engine is not importable (%s): using the slow FALLBACK generator (no KV cache)", e)
        return NaiveGenerator(model, tokenizer, max_model_len, seed=seed)
    return EngineGenerator(model, tokenizer, max_model_len, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens, seed=seed)


def run_all(gen, requests: list[tuple[Any, list[int], GenParams]], on_done=None) -> dict[Any, GenOutput]:
    """Submit `requests` and poll until all (and whatever `on_done(output)` submits) finish."""
    for tag, ids, p in requests:
        gen.submit(tag, ids, p)
    outs: dict[Any, GenOutput] = {}
    while gen.pending():
        for o in gen.poll():
            outs[o.tag] = o
            if on_done is not None:
                on_done(o)
    return outs
