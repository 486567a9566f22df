"""`LLMEngine`: the engine core behind `LLM` (and the server's driver thread).

It owns the block manager, the scheduler, the model runner, the sampler, the speculative decoder
and the request table. A step = schedule (continuous batching, chunked prefill, preemption) -> one
model forward over the flattened batch with the paged KV cache -> new tokens for the sequences
that reached their last token, as `NewTokens` (the speculative verifier's: accepted proposals plus
one, already rolled back to the verified KV; the sampler's: one) -> one path for all of them
(`core/output.py`: append, stop checks, incremental detokenization, counts, stream events,
finishing). A request that cannot be served (empty or too long prompt, bad sampling values,
non-finite logits) finishes alone with `finish_reason="error"` and a message; the others keep
going. A request with `SamplingParams.guided` (structured output) samples under its grammar's
token mask, filled while the model runs (`moe.engine.sampling.guided`, built on the first such
request).

`validate_request` is the one check of a request against this engine (`core/requests.py`; the
server calls it to answer a 400 before anything reaches the engine; `add_request` calls it too).
Invariants: moe/engine/core/invariants.py.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import warnings
from typing import Optional

import torch

from moe.attention import paged_backend
from moe.config import check_context
from moe.engine.config import EngineConfig
from moe.engine.core.invariants import install as install_invariant_checks
from moe.engine.core.output import append_token, stream_event
from moe.engine.core.profile import EngineProfiler
from moe.engine.core.requests import Prompt, check_cache_room, check_prompt, encode_prompt
from moe.engine.core.scheduler import Scheduler
from moe.engine.memory.block_manager import BlockManager
from moe.engine.memory.cache_size import num_kv_blocks
from moe.engine.memory.hybrid_blocks import HybridBlockManager
from moe.engine.memory.kv_groups import cache_layout, engine_window, is_hybrid
from moe.engine.outputs import StreamEvent
from moe.engine.runner.compiled import CompiledModelRunner
from moe.engine.runner.context import PagedKVContext
from moe.engine.runner.model_runner import ModelRunner
from moe.engine.sampling.guided import GuidedDecoder
from moe.engine.sampling.penalties import penalty_context
from moe.engine.sampling.sampler import Sampler, SamplingParams, finite_rows
from moe.engine.sequence import NewTokens, ScheduledBatch, Sequence
from moe.engine.speculative import SpecDecoder
from moe.profiling import stage
from moe.routing.metrics import RoutingWindow

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, model, tokenizer, config: EngineConfig):
        param = next(model.parameters())
        device = config.device if config.device is not None else param.device
        dtype = config.dtype if config.dtype is not None else param.dtype
        if param.device != device or param.dtype != dtype:
            model.to(device=device, dtype=dtype)
        model.eval()
        self.config = config
        self.model, self.tokenizer, self.device, self.dtype = model, tokenizer, device, dtype
        cfg = model.cfg
        if cfg.router.capacity_factor is not None:
            warnings.warn("router.capacity_factor is set: a router that drops over-capacity tokens at inference "
                          "(as 'topk' does) makes each token's output depend on what else is in the batch, so "
                          "engine outputs may differ from per-sequence forwards", stacklevel=3)
        self.max_model_len = config.max_model_len or cfg.max_seq_len
        check_context("max_model_len", self.max_model_len, cfg, allow=config.allow_long_context)
        model.rotary.extend(self.max_model_len)  # (longer than the model's context only when allowed)
        self.block_size = block_size = config.block_size
        self.backend = paged_backend(config.attention_backend, device, cfg)
        self.backend.check_config(block_size, cfg.resolved_head_dim, dtype, device)
        self.backend.check_model(cfg)  # sliding windows / sinks it cannot honour: a ConfigError naming both

        # a model whose layers all slide frees the blocks its window passed; a hybrid one keeps a block table per
        # KV cache group in one shared pool, its window groups freeing theirs (moe.engine.memory.kv_groups)
        # (tensor parallel: the worker ranks build their caches with one table, moe/engine/parallel/worker.py, so such
        # an engine keeps the one-table layout, correct but freeing nothing: per-group tables there are not built)
        self.hybrid = is_hybrid(cfg) and config.tensor_parallel_size == 1
        self.kv_layout = cache_layout(cfg, self.hybrid)
        per_block = PagedKVContext.model_bytes_per_block(cfg, block_size, dtype, config.kv_cache_dtype,
                                                         self.kv_layout.layers_per_block)
        self.kv_bytes_per_token = PagedKVContext.model_bytes_per_block(cfg, block_size, dtype,
                                                                       config.kv_cache_dtype) // block_size
        self.sliding_window = engine_window(cfg)
        self.num_blocks = num_kv_blocks(config, per_block, self.max_model_len, device, model, self.sliding_window,
                                        windows=self.kv_layout.windows)
        self.block_manager = HybridBlockManager(self.num_blocks, block_size, config.enable_prefix_caching,
                                                self.kv_layout.windows) if self.hybrid else \
            BlockManager(self.num_blocks, block_size, config.enable_prefix_caching, self.sliding_window)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        if config.compile and config.collect_routing_stats:
            warnings.warn("compile=True: compiled decode steps make no routing records, so the engine's routing "
                          "statistics count prefill and eager steps only; build with collect_routing_stats=False "
                          "to say so, or compile=False for statistics of every token", stacklevel=3)
        layout = self.kv_layout if self.hybrid else None
        if config.compile:  # static-shape compiled decode steps (and one scratch KV block for their padding)
            self.runner = CompiledModelRunner(model, self.num_blocks, block_size, self.backend, device, dtype,
                                              config.max_num_seqs, self.max_model_len,
                                              need_records=config.collect_routing_stats, layout=layout)
        else:
            # No routing statistics, no records to make: the model's inference routing (no router losses).
            self.runner = ModelRunner(model, self.num_blocks, block_size, self.backend, device, dtype,
                                      kv_cache_dtype=config.kv_cache_dtype, need_records=config.collect_routing_stats,
                                      layout=layout)
        self.sampler = Sampler(config.seed, device)
        # speculative decoding (moe.engine.speculative): its proposers and their KV caches are built on first use
        self.spec = SpecDecoder(config.speculative, model, self.num_blocks, block_size, self.backend, device, dtype,
                                config.max_num_seqs, self.sampler.generator)
        self.vocab_size = cfg.vocab_size
        self.eos_id = getattr(tokenizer, "eos_id", None) if tokenizer is not None else None
        self.requests: dict[str, Sequence] = {}  # the request table: unfinished (or unreported) requests by id
        self._unreported: list[Sequence] = []  # finished outside a step (errors, aborts): reported by the next
        self._ids = itertools.count()
        self._routing = RoutingWindow() if config.collect_routing_stats else None
        self._guided: Optional[GuidedDecoder] = None  # built by the first guided request
        self._guided_lock = threading.Lock()
        self._counters = dict(num_steps=0, prompt_tokens_computed=0, generation_tokens=0, model_time_s=0.0)
        self.profiler = EngineProfiler(config.profile, device)  # the `profile` option (torch.profiler)
        if config.check_invariants:
            install_invariant_checks(self)  # debug hook (tests): every batch, and the state after every step
        logger.info("engine: %d KV blocks of %d tokens (%.1f MiB), backend %s, %s %s", self.num_blocks, block_size,
                    self.num_blocks * per_block / 2**20, self.backend.name, device, dtype)

    # ------------------------------------------------------------------ requests
    def encode(self, prompt: Prompt) -> tuple[Optional[str], list[int]]:
        """(the text or None, the token ids) of a text prompt or a list (or tensor) of token ids."""
        return encode_prompt(prompt, self.tokenizer, self.config.add_bos)

    def validate_request(self, prompt_ids: list[int], params=None) -> SamplingParams:
        """Whether this engine can serve `prompt_ids` with `params` (a SamplingParams, a dict of
        its fields, or None for the defaults); returns the SamplingParams. Raises a RequestError
        whose `param` names the request field at fault ("prompt", "max_tokens", a sampling
        field) and whose `code` is "context_length_exceeded" for a prompt that leaves no room.
        It reads only settings fixed at construction (and compiles a guided request's grammar into
        the decoder's locked cache, param "guided" if it is invalid), so a server may call it on
        its event loop while another thread steps the engine."""
        check_prompt(prompt_ids, self.vocab_size, self.max_model_len)
        params = SamplingParams.coerce(params)
        if params.guided is not None:
            self.guided_decoder().compile(params.guided)  # an invalid schema / regex / grammar: param "guided"
        self.spec.resolve(params)  # a method this engine cannot serve: param "speculative"
        check_cache_room(len(prompt_ids), params.max_tokens, self.max_model_len, self.block_manager,
                         self.config.max_num_batched_tokens)
        return params

    def guided_decoder(self) -> GuidedDecoder:
        """The structured-output machinery (xgrammar over this tokenizer), built on first use."""
        with self._guided_lock:  # the server's loop (validate_request) and the engine thread may both get here
            if self._guided is None:
                self._guided = GuidedDecoder(self.tokenizer, self.vocab_size, self.eos_id)
            return self._guided

    def _new_id(self, request_id: Optional[str]) -> str:
        rid = str(request_id) if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.requests:
            raise ValueError(f"request id {rid!r} is already in use")
        return rid

    def add_request(self, prompt: Prompt, sampling_params=None, request_id: Optional[str] = None,
                    index: Optional[int] = None) -> str:
        """Queue a request; returns its id. Invalid requests are not raised: they finish with
        finish_reason "error" and come out of the next `step()`."""
        rid = self._new_id(request_id)
        arrival = time.perf_counter()
        try:
            text, ids = self.encode(prompt)
            params = self.validate_request(ids, sampling_params)
        except (ValueError, TypeError) as e:  # RequestError is a ValueError
            return self._add_failed(rid, str(e), prompt if isinstance(prompt, str) else None, index, arrival)
        seq = Sequence(rid, text, ids, params, arrival, index, self.sampler.new_request_generator(params.seed))
        seq.spec = self.spec.resolve(params)
        if params.guided is not None:
            seq.grammar = self._guided.matcher(params.guided)  # compiled (and cached) by validate_request
        self.requests[rid] = seq
        self.scheduler.add(seq)
        return rid

    def add_failed_request(self, error: str, prompt: Optional[str] = None, request_id: Optional[str] = None,
                           index: Optional[int] = None) -> str:
        """Record a request that failed before it could be queued (e.g. a chat template that
        rejected its messages): it comes out of the next `step()` with finish_reason "error"."""
        return self._add_failed(self._new_id(request_id), error, prompt, index, time.perf_counter())

    def _add_failed(self, rid: str, error: str, prompt: Optional[str], index: Optional[int], arrival: float) -> str:
        seq = Sequence(rid, prompt, [], SamplingParams(), arrival, index)
        seq.finish("error", error=error)
        seq.metrics.finished_time = arrival
        self.requests[rid] = seq
        self._unreported.append(seq)
        return rid

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now (finish_reason "abort", reported by the next step); False if unknown."""
        seq = self.requests.get(request_id)
        if seq is None or seq.is_finished:
            return False
        self.scheduler.remove(seq)
        seq.finish("abort")
        seq.metrics.finished_time = time.perf_counter()
        self._unreported.append(seq)
        return True

    def drop_request(self, request_id: str) -> None:
        """Abort and forget a request without reporting it (whoever added it stopped listening)."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return
        if not seq.is_finished:
            self.scheduler.remove(seq)
            seq.finish("abort")
        if seq in self._unreported:
            self._unreported.remove(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def is_idle(self) -> bool:
        """Nothing to schedule and nothing to report: a step now would do nothing."""
        return not self.scheduler.has_unfinished() and not self._unreported

    # ------------------------------------------------------------------ the step
    def step(self) -> list[StreamEvent]:
        """One scheduler step: returns an event for every request that produced tokens or
        finished (including requests that failed or were aborted since the last step)."""
        events = [self._event(s) for s in self._unreported]
        self._unreported.clear()
        self.spec.propose(self.scheduler.running, self.max_model_len)  # proposals scheduled like prefill chunks
        batch = self.scheduler.schedule()
        self.spec.take_back(batch.seqs, self.scheduler.running)  # proposals of sequences not scheduled (preempted, out of budget)
        for seq in batch.failed:
            events.append(self._fail(seq, f"the sequence ({seq.num_tokens} tokens) no longer fits in the "
                                          f"KV cache ({self.num_blocks} blocks of {self.block_size})"))
        if not batch:
            return events
        with self.profiler.step():
            new_tokens = self._execute(batch)
            now = time.perf_counter()
            events.extend(self._apply(new, now) for new in new_tokens)
        return events

    def finish_profile(self) -> None:
        """Stop the `profile` option's profiler; a window it was recording is written as it is. Call it
        on the thread that steps the engine (torch.profiler is stopped where it started)."""
        self.profiler.finish()

    def _execute(self, batch: ScheduledBatch) -> list[NewTokens]:
        """One model forward over `batch`; the new tokens (or the error) of every sequence that
        reached its last token: the speculative verifier's first, then the sampler's."""
        now = time.perf_counter()
        for seq in batch.seqs:
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = now
        masks = self._start_masks(batch)
        t0 = time.perf_counter()
        try:
            with stage("forward"):
                logits, sampled, records = self.runner.execute(batch)
        except Exception as e:  # keep serving: fail this step's requests, not the engine
            logger.exception("model step failed")
            if masks is not None:
                self._guided.wait(masks)
            self.spec.take_back([], self.scheduler.running)
            return [NewTokens(seq, error=f"model step failed: {type(e).__name__}: {e}") for seq in batch.seqs]
        self.spec.observe(batch)  # before num_computed_tokens moves on: the MTP drafter's hidden states
        c = self._counters
        c["model_time_s"] += time.perf_counter() - t0
        c["num_steps"] += 1
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            if seq.num_computed_tokens < seq.num_prompt_tokens:
                c["prompt_tokens_computed"] += min(n, seq.num_prompt_tokens - seq.num_computed_tokens)
            seq.num_computed_tokens += n
            if not seq.num_draft_tokens:  # with proposals: once verified (SpecDecoder.verify_drafts)
                self.block_manager.cache_full_blocks(seq)
        if self._routing is not None and records:
            self._routing.add(records)
        bitmask = self._guided.wait(masks) if masks is not None else None
        verified = []
        if self.spec.drafted:
            mask_row = {i: r for r, i in enumerate(sampled)}  # the bitmask has a row per sampled sequence
            verified, logits, sampled = self.spec.verify_drafts(batch, logits, sampled, self.runner.rows_per_seq,
                                                                self.block_manager, self._guided)
            if bitmask is not None and sampled:
                bitmask = bitmask[[mask_row[i] for i in sampled]]
        return verified + self._sample([batch.seqs[i] for i in sampled], logits, bitmask)

    def _sample(self, seqs: list[Sequence], logits: Optional[torch.Tensor], bitmask) -> list[NewTokens]:
        """One token for each of `seqs` (one logits row each, guided rows masked by `bitmask`)."""
        if not seqs:
            return []
        finite = finite_rows(logits)
        out = [NewTokens(s, error="the model produced non-finite logits") for s, f in zip(seqs, finite) if not f]
        ok = [i for i, f in enumerate(finite) if f]
        if not ok:
            return out
        rows = seqs if len(ok) == len(seqs) else [seqs[i] for i in ok]
        logits_mask = None
        if bitmask is not None:  # rows of the bitmask follow `seqs`, as the logits do
            logits_mask = self._guided.mask_fn(bitmask if len(ok) == len(seqs) else bitmask[ok],
                                               [r for r, s in enumerate(rows) if s.grammar is not None])
        res = self.sampler.sample(logits if len(ok) == len(seqs) else logits[ok],
                                  [s.params for s in rows], [s.generator for s in rows],
                                  [penalty_context(s, self.vocab_size, self.device) for s in rows], logits_mask)
        return out + [NewTokens(s, [tok], [lp]) for s, tok, lp in zip(rows, res.token_ids, res.logprobs)]

    def _start_masks(self, batch):
        """The grammar bitmask of the sequences that sample this step (rows in batch order, as
        the runner returns their logits), filling on the guided worker while the model runs;
        None when no guided sequence samples: unconstrained requests pay nothing."""
        if self._guided is None:
            return None
        matchers = [s.grammar for s, n in zip(batch.seqs, batch.num_new_tokens)
                    if s.num_computed_tokens + n == s.num_tokens]
        if all(m is None for m in matchers):
            return None
        return self._guided.start_masks(matchers)

    # ------------------------------------------------------------------ post-processing
    def _apply(self, new: NewTokens, now: float) -> StreamEvent:
        """The one path of a step's result for every sequence, plain or speculative: append its
        tokens one by one through the stop checks (a stop ends the request at that token), count
        them, release a finished request; the request's stream event."""
        seq = new.seq
        if new.error is not None:
            return self._fail(seq, new.error)
        for token, logprobs in zip(new.token_ids, new.logprobs):
            self._counters["generation_tokens"] += 1
            append_token(seq, token, logprobs, now, self.eos_id, self.tokenizer, self.max_model_len)
            if seq.is_finished:
                self._finish(seq, seq.finish_reason)
                break
        return self._event(seq)

    def _fail(self, seq: Sequence, error: str) -> StreamEvent:
        self._finish(seq, "error", error=error)
        return self._event(seq)

    def _finish(self, seq: Sequence, reason: str, **kw) -> None:
        """Finish `seq` (if not yet), commit the rest of its text, release its blocks."""
        if not seq.is_finished:
            seq.finish(reason, **kw)
        seq.flush_text(self.tokenizer)
        seq.metrics.finished_time = time.perf_counter()
        self.scheduler.remove(seq)
        self.spec.forget(seq)

    def _event(self, seq: Sequence) -> StreamEvent:
        """The request's stream event; a finished request leaves the request table."""
        if seq.is_finished:
            self.requests.pop(seq.request_id, None)
        return stream_event(seq)

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
            kv_cache_dtype=self.config.kv_cache_dtype, kv_bytes_per_token=self.kv_bytes_per_token,
            prefix_cache_queries=bm.prefix_queries, prefix_cache_hits=bm.prefix_hits,
            prefix_cache_hit_rate=bm.hit_rate, prefix_cache_evictions=bm.evictions,
        )
        if self._guided is not None:
            out.update(self._guided.stats())
        out.update(self.spec.stats())
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
        if self._guided is not None:
            self._guided.reset_stats()
        self.spec.reset_stats()

    def reset_prefix_cache(self) -> None:
        self.block_manager.reset_prefix_cache()
