"""Generation for the evaluations, through the engine's public API (`moe.engine.LLM`,
`SamplingParams`, `RequestOutput`).

`LLM.generate` runs a fixed list of prompts. MT-Bench's turn 2 is built from the model's own
turn-1 answer, so `run_requests` submits with `LLM.add_request` and polls `LLM.step()` itself: a
request's follow-ups are submitted the moment it finishes and join the running batch at once
(continuous batching across turns, no barrier between them).
"""

from __future__ import annotations

from typing import Callable, Hashable, Iterable, Optional, Sequence

from moe.engine import LLM, RequestOutput, SamplingParams

Request = tuple[Hashable, Sequence[int], SamplingParams]  # (key, prompt token ids, sampling params)
OnFinish = Callable[[Hashable, RequestOutput], Optional[Iterable[Request]]]


def run_requests(llm: LLM, requests: Iterable[Request], on_finish: Optional[OnFinish] = None) -> dict:
    """Run `requests` to completion: {key: RequestOutput}. `on_finish(key, output)` is called as
    each one finishes and may return follow-up requests, which are submitted right away. Failed
    requests come back with finish_reason "error" (the engine does not raise for them)."""
    keys: dict[str, Hashable] = {}  # engine request id -> caller's key, while unfinished

    def submit(key: Hashable, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        keys[llm.add_request(list(prompt_ids), params)] = key

    for request in requests:
        submit(*request)
    outputs: dict = {}
    while keys:
        for event in llm.step():
            if not event.finished or event.request_id not in keys:
                continue
            key = keys.pop(event.request_id)
            outputs[key] = event.output
            for follow_up in (on_finish(key, event.output) if on_finish is not None else None) or ():
                submit(*follow_up)
        if keys and not llm.has_unfinished_requests():
            raise RuntimeError(f"the engine is idle but {len(keys)} request(s) never finished")
    return outputs


def engine_stats(llm: LLM) -> dict:
    """The engine's scalar counters (`LLM.stats()` without the per-layer expert loads)."""
    return {k: v for k, v in llm.stats().items() if isinstance(v, (int, float))}
