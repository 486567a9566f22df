"""`LLMEngine`: the engine core behind `LLM` (and the server's driver thread).

It owns the block manager, the scheduler, the model runner, the sampler and the request table. A step =
schedule (continuous batching, chunked prefill, preemption) -> one model forward over the flattened batch with
the paged KV cache -> sample the sequences that reached their last token -> post-processing (stop checks,
incremental detokenization, finishing). A request that cannot be served (empty or too long prompt, bad sampling
values, non-finite logits) finishes alone with `finish_reason="error"` and a message; the others keep going. A
request with `SamplingParams.guided` (structured output) samples under its grammar's token mask, filled while
the model runs (`moe.engine.guided`, built on the first such request).

`validate_request` is the one check of a request against this engine (the server calls it to answer a 400
before anything reaches the engine; `add_request` calls it too). Invariants: moe/engine/invariants.py.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import warnings
from typing import Optional, Union

import torch

from moe.attention import paged_backend
from moe.config import check_context
from moe.engine.block_manager import BlockManager
from moe.engine.cache_size import num_kv_blocks
from moe.engine.compiled import CompiledModelRunner
from moe.engine.config import EngineConfig
from moe.engine.context import PagedKVContext
from moe.engine.guided import GuidedDecoder
from moe.engine.invariants import install as install_invariant_checks
from moe.engine.model_runner import ModelRunner
from moe.engine.outputs import StreamEvent
from moe.engine.sampler import Sampler, SamplingParams, penalty_context
from moe.engine.scheduler import Scheduler
from moe.engine.sequence import Sequence
from moe.engine.spec import SpecDecoder, verify_drafts
from moe.errors import RequestError
from moe.routing.metrics import RoutingWindow

logger = logging.getLogger(__name__)

Prompt = Union[str, list[int]]


def _is_token_id(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


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
        self.backend = paged_backend(config.attention_backend, device)
        self.backend.check_config(block_size, cfg.resolved_head_dim, dtype, device)

        per_block = PagedKVContext.bytes_per_block(cfg.n_layers, block_size, cfg.n_kv_heads, cfg.resolved_head_dim,
                                                   dtype, config.kv_cache_dtype)
        self.kv_bytes_per_token = per_block // block_size
        self.num_blocks = num_kv_blocks(config, per_block, self.max_model_len, device, model)
        self.block_manager = BlockManager(self.num_blocks, block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        if config.compile:  # static-shape compiled decode steps (and one scratch KV block for their padding)
            self.runner = CompiledModelRunner(model, self.num_blocks, block_size, self.backend, device, dtype,
                                              config.max_num_seqs, self.max_model_len)
        else:
            self.runner = ModelRunner(model, self.num_blocks, block_size, self.backend, device, dtype,
                                      kv_cache_dtype=config.kv_cache_dtype)
        self.sampler = Sampler(config.seed, device)
        # speculative decoding (moe.engine.spec): its proposers and their KV caches are built on first use
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
        if config.check_invariants:
            install_invariant_checks(self)  # debug hook (tests): every batch, and the state after every step
        logger.info("engine: %d KV blocks of %d tokens (%.1f MiB), backend %s, %s %s", self.num_blocks, block_size,
                    self.num_blocks * per_block / 2**20, self.backend.name, device, dtype)

    # ------------------------------------------------------------------ requests
    def encode(self, prompt: Prompt) -> tuple[Optional[str], list[int]]:
        """(the text or None, the token ids) of a text prompt or a list (or tensor) of token ids."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("text prompts need a tokenizer (pass token ids, or a tokenizer to from_model)",
                                   param="prompt")
            return prompt, list(self.tokenizer.encode(prompt, add_bos=self.config.add_bos))
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.tolist()
        if not isinstance(prompt, (list, tuple)) or not all(_is_token_id(t) for t in prompt):
            raise RequestError(f"a prompt must be a str or a list of token ids; got {type(prompt).__name__}",
                               param="prompt")
        return None, list(prompt)

    def validate_request(self, prompt_ids: list[int], params=None) -> SamplingParams:
        """Whether this engine can serve `prompt_ids` with `params` (a SamplingParams, a dict of
        its fields, or None for the defaults); returns the SamplingParams. Raises a RequestError
        whose `param` names the request field at fault ("prompt", "max_tokens", a sampling
        field) and whose `code` is "context_length_exceeded" for a prompt that leaves no room.
        It reads only settings fixed at construction (and compiles a guided request's grammar into
        the decoder's locked cache, param "guided" if it is invalid), so a server may call it on
        its event loop while another thread steps the engine."""
        if not prompt_ids:
            raise RequestError("the prompt is empty (it encodes to no tokens)", param="prompt")
        bad = [t for t in prompt_ids if not _is_token_id(t) or not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})",
                               param="prompt")
        n, limit = len(prompt_ids), self.max_model_len
        if n >= limit:
            raise RequestError(f"This model's maximum context length is {limit} tokens (max_model_len), but the "
                               f"prompt has {n} tokens: at most {limit - 1} prompt tokens leave room to generate",
                               param="prompt", code="context_length_exceeded")
        params = SamplingParams.coerce(params)
        if params.guided is not None:
            self.guided_decoder().compile(params.guided)  # an invalid schema / regex / grammar: param "guided"
        self.spec.resolve(params)  # a method this engine cannot serve: param "speculative"
        cached = min(n + params.max_tokens, limit) - 1  # the last token is never fed back
        need = self.block_manager.blocks_needed(cached)
        if need > self.num_blocks:
            raise RequestError(f"the request needs up to {need} KV blocks ({cached} tokens of prompt + max_tokens) "
                               f"but the cache has only {self.num_blocks} ({self.num_blocks * self.block_size} "
                               "tokens); lower max_tokens or give the cache more memory", param="max_tokens")
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
            self._finish(seq, "error", error=f"the sequence ({seq.num_tokens} tokens) no longer fits in the "
                                             f"KV cache ({self.num_blocks} blocks of {self.block_size})")
            events.append(self._event(seq))
        if not batch:
            return events
        now = time.perf_counter()
        for seq in batch.seqs:
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = now
        masks = self._start_masks(batch)
        t0 = time.perf_counter()
        try:
            logits, sampled, records = self.runner.execute(batch)
        except Exception as e:  # keep serving: fail this step's requests, not the engine
            logger.exception("model step failed")
            if masks is not None:
                self._guided.wait(masks)
            self.spec.take_back([], self.scheduler.running)
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
            if not seq.num_draft_tokens:  # with proposals: once verified (_verify_drafts)
                self.block_manager.cache_full_blocks(seq)
        if self._routing is not None and records:
            self._routing.add(records)
        bitmask = self._guided.wait(masks) if masks is not None else None
        if self.spec.drafted:
            logits, sampled = verify_drafts(self, batch, logits, sampled, events)
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
            logits_mask = None
            if bitmask is not None:  # rows of the bitmask follow `seqs`, as the logits do
                logits_mask = self._guided.mask_fn(bitmask if len(ok) == len(seqs) else bitmask[ok],
                                                   [r for r, s in enumerate(rows) if s.grammar is not None])
            res = self.sampler.sample(logits if len(ok) == len(seqs) else logits[ok],
                                      [s.params for s in rows], [s.generator for s in rows],
                                      [penalty_context(s, self.vocab_size, self.device) for s in rows],
                                      logits_mask)
            now = time.perf_counter()
            c["generation_tokens"] += len(rows)
            for seq, tok, lp in zip(rows, res.token_ids, res.logprobs):
                self._append_token(seq, tok, lp, now)
                events.append(self._event(seq))
        return events

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
    def _append_token(self, seq: Sequence, token: int, logprobs, now: float) -> None:
        """Record a sampled token, then the stop checks, in order: eos / stop token ids (no
        text), stop strings (while detokenizing), the grammar's end, max_tokens and max_model_len."""
        p = seq.params
        grammar_done = False
        if seq.grammar is not None:
            if not seq.grammar.accept_token(token):  # the mask allowed only accepted tokens: a bug if reached
                self._finish(seq, "error", error=f"the grammar rejected token {token}")
                return
            grammar_done = seq.grammar.is_terminated()
        seq.token_ids.append(token)
        m = seq.metrics
        if m.first_token_time is None:
            m.first_token_time = now
        m.token_times.append(now)
        if seq.logprobs is not None:
            seq.logprobs.append(logprobs)
        # A finished grammar allows nothing after its stop token: that ends the request even with ignore_eos.
        if (token == self.eos_id and (not p.ignore_eos or grammar_done)) or (p.stop_token_ids and
                                                                            token in p.stop_token_ids):
            seq.drop_last_from_text = True  # a stop token adds no text
            seq.finish("stop", stop_reason=token)
        else:
            seq.detokenize(self.tokenizer)  # may finish on a stop string
        if not seq.is_finished and grammar_done:  # no eos token: the grammar ended on its last text token
            seq.finish("stop")
        if not seq.is_finished and (seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len):
            seq.finish("length")
        if seq.is_finished:
            self._finish(seq, seq.finish_reason)

    def _finish(self, seq: Sequence, reason: str, **kw) -> None:
        """Finish `seq` (if not yet), commit the rest of its text, release its blocks."""
        if not seq.is_finished:
            seq.finish(reason, **kw)
        seq.flush_text(self.tokenizer)
        seq.metrics.finished_time = time.perf_counter()
        self.scheduler.remove(seq)
        self.spec.forget(seq)

    def _event(self, seq: Sequence) -> StreamEvent:
        """The request's new text and tokens; a finished request leaves the request table."""
        delta, toks = seq.take_delta()
        finished = seq.is_finished
        if finished:
            self.requests.pop(seq.request_id, None)
        logprobs = seq.logprobs[len(seq.logprobs) - len(toks):] if seq.logprobs is not None and toks else None
        return StreamEvent(seq.index, seq.request_id, delta, toks, finished, seq.finish_reason,
                           seq.to_output() if finished else None, logprobs)

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
