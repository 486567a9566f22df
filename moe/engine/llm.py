"""`LLM`: the offline/online front end of the engine.

    llm = LLM("runs/x/checkpoints/step_0001000.pt")           # or LLM.from_model(model, tokenizer)
    outs = llm.generate(["Once upon a time"], SamplingParams(temperature=0.8, max_tokens=64))
    for ev in llm.stream(prompts, params): print(ev.text_delta, end="")
    llm.chat([{"role": "user", "content": "hi"}])
    rid = llm.add_request("...", params); events = llm.step()  # what a server loop does

A step = schedule (continuous batching, chunked prefill, preemption) -> one model forward over
the flattened batch with the paged KV cache -> sample the sequences that reached their last
token -> stop checks and incremental detokenization. A request that cannot be served (empty or
too long prompt, bad sampling values, non-finite logits) finishes alone with
`finish_reason="error"` and a message; the others keep going.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
import warnings
from typing import Iterator, Optional, Sequence as Seq, Union

import torch

from kernels.paged_attention import get_backend
from moe.engine.block_manager import BlockManager
from moe.engine.context import PagedKVContext
from moe.engine.model_runner import ModelRunner
from moe.engine.outputs import RequestOutput, StreamEvent
from moe.engine.sampler import Sampler, SamplingParams
from moe.engine.scheduler import Scheduler
from moe.engine.sequence import Sequence

logger = logging.getLogger(__name__)

Prompt = Union[str, list[int]]
_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
           "fp16": torch.float16, "float16": torch.float16, "half": torch.float16}


def _resolve_dtype(dtype) -> Optional[torch.dtype]:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise ValueError(f"dtype={dtype!r} is not one of {sorted(_DTYPES)} (or a torch.dtype)")


def _is_single_prompt(prompts) -> bool:
    return isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and len(prompts) > 0
                                        and all(isinstance(t, int) for t in prompts))


class LLM:
    """Options (all keyword):

    block_size (16) tokens per KV block; num_blocks (None: sized from kv_cache_memory_bytes, else
    kv_cache_memory_fraction of free memory, else on CPU enough for max_num_seqs full-length
    sequences); enable_prefix_caching (True); max_num_seqs (64) running sequences per step;
    max_num_batched_tokens (2048) tokens per step; max_model_len (the model's max_seq_len);
    attention_backend ("auto": triton on CUDA, torch on CPU; or "torch" | "triton" | "flash");
    device, dtype (defaults: the model's; for a checkpoint CUDA + bf16 when available, else CPU +
    fp32); seed (engine RNG for requests without their own seed); add_bos (False: prompts are
    encoded as the training data was, without BOS); collect_routing_stats (True).
    """

    def __init__(self, checkpoint_path, **opts):
        from moe.checkpoint import load_model  # lazy: only this path needs it

        device = torch.device(opts.pop("device", None) or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = _resolve_dtype(opts.pop("dtype", None))
        if dtype is None:
            dtype = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
        model, tokenizer, _cfg = load_model(checkpoint_path, device=device, dtype=dtype)
        self._setup(model, tokenizer, device=device, dtype=dtype, **opts)

    @classmethod
    def from_model(cls, model, tokenizer=None, **opts) -> "LLM":
        """Serve an in-memory `Transformer` (put in eval mode; moved/cast in place only if
        `device`/`dtype` are given). Without a tokenizer, prompts must be token ids."""
        self = cls.__new__(cls)
        self._setup(model, tokenizer, **opts)
        return self

    # ------------------------------------------------------------------ setup
    def _setup(self, model, tokenizer, *, block_size: int = 16, num_blocks: Optional[int] = None,
               kv_cache_memory_bytes: Optional[int] = None, kv_cache_memory_fraction: Optional[float] = None,
               enable_prefix_caching: bool = True, max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
               max_model_len: Optional[int] = None, attention_backend: str = "auto", device=None, dtype=None,
               seed: Optional[int] = None, add_bos: bool = False, collect_routing_stats: bool = True) -> None:
        param = next(model.parameters())
        device = torch.device(device) if device is not None else param.device
        dtype = _resolve_dtype(dtype) or param.dtype
        if param.device != device or param.dtype != dtype:
            model.to(device=device, dtype=dtype)
        model.eval()
        self.model, self.tokenizer, self.device, self.dtype = model, tokenizer, device, dtype
        cfg = model.cfg
        if getattr(model.router_cfg, "capacity_factor", None) is not None:
            warnings.warn("router.capacity_factor is set: a router that drops over-capacity tokens at inference "
                          "(as 'topk' does) makes each token's output depend on what else is in the batch, so "
                          "engine outputs may differ from per-sequence forwards", stacklevel=3)
        for name, v in (("block_size", block_size), ("max_num_seqs", max_num_seqs),
                        ("max_num_batched_tokens", max_num_batched_tokens)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive int")
        self.max_model_len = int(max_model_len or cfg.max_seq_len)
        if self.max_model_len > cfg.max_seq_len:
            warnings.warn(f"max_model_len={self.max_model_len} exceeds the model's max_seq_len={cfg.max_seq_len}: "
                          "positions beyond it were never trained", stacklevel=3)
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len={self.max_model_len} must be >= 2")
        self.block_size, self.add_bos = block_size, add_bos
        self.backend = get_backend(attention_backend, device)
        self.backend.check_config(block_size, cfg.resolved_head_dim, dtype, device)

        per_block = PagedKVContext.bytes_per_block(cfg.n_layers, block_size, cfg.n_kv_heads, cfg.resolved_head_dim,
                                                   dtype)
        self.num_blocks = self._size_cache(num_blocks, kv_cache_memory_bytes, kv_cache_memory_fraction, per_block,
                                           max_num_seqs)
        self.block_manager = BlockManager(self.num_blocks, block_size, enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs, max_num_batched_tokens)
        self.runner = ModelRunner(model, self.num_blocks, block_size, self.backend, device, dtype)
        self.sampler = Sampler(seed, device)
        self.vocab_size = cfg.vocab_size
        self.eos_id = getattr(tokenizer, "eos_id", None) if tokenizer is not None else None
        self._seqs: dict[str, Sequence] = {}  # unfinished requests by id
        self._pending: list[Sequence] = []  # finished outside a step (errors, aborts), reported next step
        self._ids = itertools.count()
        self._routing = None
        if collect_routing_stats:
            from moe.metrics import RoutingWindow
            self._routing = RoutingWindow()
        self._counters = dict(num_steps=0, prompt_tokens_computed=0, generation_tokens=0, model_time_s=0.0)
        logger.info("engine: %d KV blocks of %d tokens (%.1f MiB), backend %s, %s %s", self.num_blocks, block_size,
                    self.num_blocks * per_block / 2**20, self.backend.name, device, dtype)

    def _size_cache(self, num_blocks, mem_bytes, fraction, per_block: int, max_num_seqs: int) -> int:
        if num_blocks is not None:
            if not isinstance(num_blocks, int) or num_blocks < 1:
                raise ValueError(f"num_blocks={num_blocks!r} must be a positive int")
            return num_blocks
        if mem_bytes is not None:
            n = int(mem_bytes) // per_block
            if n < 1:
                raise ValueError(f"kv_cache_memory_bytes={mem_bytes} is less than one KV block ({per_block} bytes)")
            return n
        if fraction is not None and not 0 < fraction <= 1:
            raise ValueError(f"kv_cache_memory_fraction={fraction!r} must be in (0, 1]")
        full = max_num_seqs * math.ceil(self.max_model_len / self.block_size)
        if self.device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(self.device)
            return max(1, int(free * (fraction or 0.8)) // per_block)
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = 8 * 2**30
        if fraction is not None:
            return max(1, int(avail * fraction) // per_block)
        return max(1, min(full, int(avail * 0.25) // per_block))

    # ------------------------------------------------------------------ requests
    def _encode(self, prompt) -> tuple[Optional[str], list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer (pass token ids, or a tokenizer to from_model)")
            return prompt, list(self.tokenizer.encode(prompt, add_bos=self.add_bos))
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.tolist()
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                            for t in prompt):
            raise ValueError(f"a prompt must be a str or a list of token ids; got {type(prompt).__name__}")
        return None, list(prompt)

    def _check(self, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise ValueError("the prompt is empty (it encodes to no tokens)")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens but max_model_len is {self.max_model_len}: "
                             f"at most {self.max_model_len - 1} prompt tokens leave room to generate")
        cached = min(len(ids) + params.max_tokens, self.max_model_len) - 1  # the last token is never fed back
        need = self.block_manager.blocks_needed(cached)
        if need > self.num_blocks:
            raise ValueError(f"the request needs up to {need} KV blocks ({cached} tokens) but the cache has only "
                             f"{self.num_blocks}; lower max_tokens or give the cache more memory")

    def add_request(self, prompt: Prompt, sampling_params=None, request_id: Optional[str] = None,
                    index: Optional[int] = None, _prompt_error: Optional[str] = None) -> str:
        """Queue a request; returns its id. Invalid requests are not raised: they finish with
        finish_reason "error" and come out of the next `step()`."""
        rid = str(request_id) if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._seqs:
            raise ValueError(f"request id {rid!r} is already in use")
        arrival = time.perf_counter()
        text, ids, params, error = (prompt if isinstance(prompt, str) else None), [], None, _prompt_error
        try:
            params = SamplingParams.coerce(sampling_params)
            if error is None:
                text, ids = self._encode(prompt)
                self._check(ids, params)
        except (ValueError, TypeError) as e:
            error = str(e)
        if params is None:
            params = SamplingParams()
        seq = Sequence(rid, text, ids, params, arrival, index, self.sampler.new_request_generator(params.seed))
        self._seqs[rid] = seq
        if error is not None:
            seq.finish("error", error=error)
            seq.metrics.finished_time = arrival
            self._pending.append(seq)
        else:
            self.scheduler.add(seq)
        return rid

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now (finish_reason "abort", reported by the next step); False if unknown."""
        seq = self._seqs.get(request_id)
        if seq is None or seq.is_finished:
            return False
        self.scheduler.remove(seq)
        seq.finish("abort")
        seq.metrics.finished_time = time.perf_counter()
        self._pending.append(seq)
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self._seqs)

    # ------------------------------------------------------------------ the step
    def _event(self, seq: Sequence) -> StreamEvent:
        delta, toks = seq.take_delta()
        finished = seq.is_finished
        if finished:
            self._seqs.pop(seq.request_id, None)
        logprobs = seq.logprobs[len(seq.logprobs) - len(toks):] if seq.logprobs is not None and toks else None
        return StreamEvent(seq.index, seq.request_id, delta, toks, finished, seq.finish_reason,
                           seq.to_output() if finished else None, logprobs)

    def _finish(self, seq: Sequence, reason: str, **kw) -> None:
        if not seq.is_finished:
            seq.finish(reason, **kw)
        seq.flush_text(self.tokenizer)
        seq.metrics.finished_time = time.perf_counter()
        self.scheduler.remove(seq)

    def _append_token(self, seq: Sequence, token: int, logprobs, now: float) -> None:
        p = seq.params
        seq.token_ids.append(token)
        m = seq.metrics
        if m.first_token_time is None:
            m.first_token_time = now
        m.token_times.append(now)
        if seq.logprobs is not None:
            seq.logprobs.append(logprobs)
        if (not p.ignore_eos and token == self.eos_id) or (p.stop_token_ids and token in p.stop_token_ids):
            seq.drop_last_from_text = True  # a stop token adds no text
            seq.finish("stop", stop_reason=token)
        else:
            seq.detokenize(self.tokenizer)  # may finish on a stop string
        if not seq.is_finished and (seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len):
            seq.finish("length")
        if seq.is_finished:
            self._finish(seq, seq.finish_reason)

    def step(self) -> list[StreamEvent]:
        """One scheduler step: returns an event for every request that produced tokens or
        finished (including requests that failed or were aborted since the last step)."""
        events = [self._event(s) for s in self._pending]
        self._pending.clear()
        batch = self.scheduler.schedule()
        for seq in batch.failed:
            self._finish(seq, "error", error=f"the sequence ({seq.num_tokens} tokens) no longer fits in the "
                                             f"KV cache ({self.num_blocks} blocks of {self.block_size})")
            events.append(self._event(seq))
        if not batch:
            return events
        now = time.perf_counter()
        for seq in batch.seqs:
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = now
        t0 = time.perf_counter()
        try:
            logits, sampled, records = self.runner.execute(batch)
        except Exception as e:  # keep serving: fail this step's requests, not the engine
            logger.exception("model step failed")
            for seq in batch.seqs:
                self._finish(seq, "error", error=f"model step failed: {type(e).__name__}: {e}")
                events.append(self._event(seq))
            return events
        c = self._counters
        c["model_time_s"] += time.perf_counter() - t0
        c["num_steps"] += 1
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            if seq.num_computed_tokens < seq.num_prompt_tokens:
                c["prompt_tokens_computed"] += min(n, seq.num_prompt_tokens - seq.num_computed_tokens)
            seq.num_computed_tokens += n
            self.block_manager.cache_full_blocks(seq)
        if self._routing is not None and records:
            self._routing.add(records)
        if not sampled:
            return events

        seqs = [batch.seqs[i] for i in sampled]
        finite = torch.isfinite(logits).all(dim=-1).tolist()
        ok = [i for i, f in enumerate(finite) if f]
        for i, f in enumerate(finite):
            if not f:
                self._finish(seqs[i], "error", error="the model produced non-finite logits")
                events.append(self._event(seqs[i]))
        if ok:
            rows = seqs if len(ok) == len(seqs) else [seqs[i] for i in ok]
            res = self.sampler.sample(logits if len(ok) == len(seqs) else logits[ok],
                                      [s.params for s in rows], [s.generator for s in rows],
                                      [s.token_ids if s.params.repetition_penalty != 1.0 else () for s in rows])
            now = time.perf_counter()
            c["generation_tokens"] += len(rows)
            for seq, tok, lp in zip(rows, res.token_ids, res.logprobs):
                self._append_token(seq, tok, lp, now)
                events.append(self._event(seq))
        return events

    # ------------------------------------------------------------------ batch APIs
    def _add_batch(self, prompts, sampling_params, errors: Optional[list] = None) -> list[str]:
        if _is_single_prompt(prompts):
            prompts = [prompts]
        prompts = list(prompts)
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(prompts):
                raise ValueError(f"got {len(sampling_params)} sampling params for {len(prompts)} prompts "
                                 "(give one, or one per prompt)")
            params = list(sampling_params)
        else:
            params = [sampling_params] * len(prompts)
        errors = errors or [None] * len(prompts)
        return [self.add_request(p, sp, index=i, _prompt_error=e)
                for i, (p, sp, e) in enumerate(zip(prompts, params, errors))]

    def _run(self, rids: list[str]) -> Iterator[StreamEvent]:
        pending = set(rids)
        try:
            while pending:
                events = self.step()
                if not events and not self.scheduler.has_unfinished() and not self._pending:
                    raise RuntimeError(f"engine is idle but requests {sorted(pending)} never finished")
                for ev in events:
                    if ev.request_id in pending:
                        if ev.finished:
                            pending.discard(ev.request_id)
                        yield ev
        finally:  # the caller stopped early: do not leave its requests running
            for rid in pending:
                seq = self._seqs.pop(rid, None)
                if seq is not None and not seq.is_finished:
                    self.scheduler.remove(seq)
                    seq.finish("abort")
                if seq in self._pending:
                    self._pending.remove(seq)

    def generate(self, prompts: Union[Prompt, Seq[Prompt]], sampling_params=None) -> list[RequestOutput]:
        """Generate for one prompt or a list (str or token ids); `sampling_params` is one
        SamplingParams (or dict) for all, or a list with one per prompt. Outputs keep the
        prompts' order. (Requests added with `add_request` also advance meanwhile, but their
        events are not returned: a server should drive `step()` itself.)"""
        return self._collect(self._add_batch(prompts, sampling_params))

    def _collect(self, rids: list[str]) -> list[RequestOutput]:
        outputs: dict[str, RequestOutput] = {}
        for ev in self._run(rids):
            if ev.finished:
                outputs[ev.request_id] = ev.output
        return [outputs[r] for r in rids]

    def stream(self, prompts: Union[Prompt, Seq[Prompt]], sampling_params=None) -> Iterator[StreamEvent]:
        """An iterator of `StreamEvent(index, request_id, text_delta, token_ids, finished, ...)`
        as tokens are generated; each request's deltas concatenate to its final text. The
        requests are queued at once; closing the iterator early aborts those still running."""
        return self._run(self._add_batch(prompts, sampling_params))

    def _chat_prompts(self, messages) -> tuple[list, list]:
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer")
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts, errors = [], []
        for conv in convs:
            try:
                prompts.append(self.tokenizer.apply_chat_template(conv, add_generation_prompt=True))
                errors.append(None)
            except (ValueError, TypeError, KeyError) as e:
                prompts.append("")
                errors.append(f"bad chat messages: {e}")
        return prompts, errors

    def chat(self, messages, sampling_params=None) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of {"role", "content"} dicts) or a list of
        conversations, rendered with the tokenizer's chat template."""
        prompts, errors = self._chat_prompts(messages)
        return self._collect(self._add_batch(prompts, sampling_params, errors))

    def stream_chat(self, messages, sampling_params=None) -> Iterator[StreamEvent]:
        """`chat`, streamed as `stream` does."""
        prompts, errors = self._chat_prompts(messages)
        return self._run(self._add_batch(prompts, sampling_params, errors))

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict:
        """Engine counters, KV cache use, prefix-cache hit rate and (with
        collect_routing_stats) routing metrics of all tokens run so far (`moe/...` keys as in
        training, plus `moe/expert_load`: layers x experts fraction of assignments)."""
        bm = self.block_manager
        out = dict(self._counters)
        out.update(
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            num_preemptions=self.scheduler.num_preemptions,
            kv_blocks_total=bm.num_blocks, kv_blocks_used=bm.num_used_blocks,
            kv_cache_usage=bm.num_used_blocks / bm.num_blocks,
            prefix_cache_queries=bm.prefix_queries, prefix_cache_hits=bm.prefix_hits,
            prefix_cache_hit_rate=bm.hit_rate, prefix_cache_evictions=bm.evictions,
        )
        if self._routing is not None and self._routing.layers:
            summary, loads = self._routing.summarize()
            out.update({k: v for k, v in summary.items() if not k.endswith(("aux_loss", "z_loss"))})
            out["moe/expert_load"] = loads
        return out

    def reset_stats(self) -> None:
        for k in self._counters:
            self._counters[k] = 0 if isinstance(self._counters[k], int) else 0.0
        bm = self.block_manager
        bm.prefix_queries = bm.prefix_hits = bm.evictions = 0
        self.scheduler.num_preemptions = 0
        if self._routing is not None:
            self._routing.reset()

    def reset_prefix_cache(self) -> None:
        self.block_manager.reset_prefix_cache()
