"""Generation for the evaluations, through the engine's public API (`moe.engine.LLM`,
`SamplingParams`, `RequestOutput`).

`LLM.generate` runs a fixed list of prompts. MT-Bench's turn 2 is built from the model's own
turn-1 answer, so `run_requests` submits with `LLM.add_request` and polls `LLM.step()` itself: a
request's follow-ups are submitted the moment it finishes and join the running batch at once
(continuous batching across turns, no barrier between them).

`open_engine` builds the engine a task generates with: `LLM.from_model` over the model this
process loaded, or with `tensor_parallel_size=T > 1` an `LLM(ckpt, tensor_parallel_size=T, ...)`
that spawns its ranks and reads each one's slices (this process then never loads the whole model).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Hashable, Iterable, Iterator, Optional, Sequence

from moe.engine import LLM, RequestOutput, SamplingParams

Request = tuple[Hashable, Sequence[int], SamplingParams]  # (key, prompt token ids, sampling params)
OnFinish = Callable[[Hashable, RequestOutput], Optional[Iterable[Request]]]


@contextmanager
def open_engine(ctx, **opts) -> Iterator[LLM]:
    """The engine for `ctx` (an `EvalContext`) with engine options `opts`, shut down on exit.
    One rank: over `ctx.model` (loaded with the run's routing and quantization). Several:
    from the checkpoint path, with the same options plus the run's device, dtype, tf32 and
    routing (quantization is refused with T > 1 by eval.config)."""
    cfg = ctx.cfg
    if cfg.tensor_parallel_size > 1:
        llm = LLM(cfg.ckpt, tensor_parallel_size=cfg.tensor_parallel_size, expert_parallel=cfg.expert_parallel,
                  routing=cfg.router.as_dict() or None, device=ctx.device, dtype=ctx.dtype, tf32=cfg.tf32, **opts)
    else:
        llm = LLM.from_model(ctx.model, ctx.tokenizer, **opts)
    try:
        yield llm
    finally:
        llm.shutdown()


def model_header(ckpt: Any) -> tuple[Any, Any]:
    """(model config, tokenizer) of a checkpoint without reading its weights: what a task needs
    before it builds a multi-rank engine (prompt lengths, the context length)."""
    from moe.engine.parallel.shard_load import open_source  # lazy: only for T > 1
    from moe.loading import read_model_source
    source = open_source(ckpt)
    if source is None:  # a DCP directory cannot be read in slices (its ranks load it whole too)
        source = read_model_source(ckpt)
        return source.model, source.tokenizer
    return source.model_cfg, source.tokenizer


def param_counts(model_cfg: Any) -> dict:
    """{"params", "active_params"} of a model of `model_cfg`, built on the meta device (no memory,
    no weights read): what results.json records of a model that only its ranks load."""
    from moe.meta import meta_device  # lazy: only for T > 1
    from moe.model import Transformer
    with meta_device():
        model = Transformer(model_cfg)
    return {"params": model.num_params(), "active_params": model.num_params(active=True)}


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
