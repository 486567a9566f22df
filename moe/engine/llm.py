"""`LLM`: the offline/online front end of the engine (a thin layer over `LLMEngine`).

    llm = LLM("runs/x/checkpoints/step_0001000.pt")           # or LLM.from_model(model, tokenizer)
    outs = llm.generate(["Once upon a time"], SamplingParams(temperature=0.8, max_tokens=64))
    for ev in llm.stream(prompts, params): print(ev.text_delta, end="")
    llm.chat([{"role": "user", "content": "hi"}])
    rid = llm.add_request("...", params); events = llm.step()  # what a server loop does

The options (keywords of `LLM(...)` and `LLM.from_model(...)`) are the fields of
`moe.engine.config.EngineConfig`; an unknown one is a ConfigError naming it.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Optional, Sequence as Seq, Union

import torch

from moe.engine.config import EngineConfig
from moe.engine.engine import LLMEngine, Prompt
from moe.engine.outputs import RequestOutput, StreamEvent
from moe.engine.sampler import SamplingParams
from moe.loading import load_model, quantize_loaded
from moe.perf import device_defaults, set_tf32


def _is_single_prompt(prompts) -> bool:
    return isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and len(prompts) > 0
                                        and all(isinstance(t, int) for t in prompts))


class LLM:
    """Options (all keyword; see `EngineConfig`): block_size (16); num_blocks /
    kv_cache_memory_bytes / kv_cache_memory_fraction (KV cache size; default: sized by the
    engine); enable_prefix_caching (True); max_num_seqs (64); max_num_batched_tokens (2048);
    max_model_len (the model's max_seq_len); attention_backend ("auto": triton on CUDA, torch on
    CPU; or "torch" | "triton" | "flash"); device, dtype (defaults: the model's; for a checkpoint
    CUDA + bf16 when available, else CPU + fp32); seed; add_bos (False); collect_routing_stats (True);
    speculative (None; "ngram" | "self" | {"method": "draft", "model": path, "num_tokens": 4, ...}:
    `moe.engine.spec_config.SpeculativeConfig`, the default of requests that do not choose); compile
    (False: compiled static-shape decode steps, `moe.engine.compiled`);
    kv_cache_dtype ("auto": the model's dtype; "fp8_e4m3": E4M3 with per-token, per-head scales).

    `routing` (not an engine option: it changes the model) serves the model routed differently,
    without retraining: {"top_k": 4, "drop_experts": [1, 5], "renormalize": False}, any subset
    (`Transformer.set_routing`). `quantization` (not an engine option either) serves the model
    quantized: a scheme name (`moe.quant.allowed_schemes()`; None / "none": as stored) or a dict
    `{"scheme": ..., <the scheme's options>}` (awq needs `calib_path`); docs/quantization.md.
    """

    def __init__(self, checkpoint_path, routing: Optional[dict] = None, quantization=None, **opts):
        config = EngineConfig.from_options(opts)  # bad options fail before the checkpoint loads
        device = config.device
        if device is None:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = device_defaults(device, config.dtype, config.tf32, what="engine")  # None: auto (bf16 on CUDA, fp32 on CPU)
        model, tokenizer, _cfg = load_model(checkpoint_path, device=device, dtype=dtype, routing=routing,
                                            quantization=quantization)
        self.engine = LLMEngine(model, tokenizer, dataclasses.replace(config, device=device, dtype=dtype))

    @classmethod
    def from_model(cls, model, tokenizer=None, routing: Optional[dict] = None, quantization=None,
                   **opts) -> "LLM":
        """Serve an in-memory `Transformer` (put in eval mode; moved/cast in place only if
        `device`/`dtype` are given; its routing changed in place by `routing`, its weights
        quantized in place by `quantization`). Without a tokenizer, prompts must be token ids."""
        config = EngineConfig.from_options(opts)
        if routing:
            model.set_routing(**routing)
        model = quantize_loaded(model, tokenizer, quantization)
        set_tf32(config.device or next(model.parameters()).device, config.tf32)  # dtype: the model's unless given
        self = cls.__new__(cls)
        self.engine = LLMEngine(model, tokenizer, config)
        return self

    # ------------------------------------------------------------------ the engine's parts and settings
    config = property(lambda self: self.engine.config, doc="the EngineConfig")
    model = property(lambda self: self.engine.model)
    tokenizer = property(lambda self: self.engine.tokenizer)
    device = property(lambda self: self.engine.device)
    dtype = property(lambda self: self.engine.dtype)
    max_model_len = property(lambda self: self.engine.max_model_len, doc="longest prompt + output, in tokens")
    vocab_size = property(lambda self: self.engine.vocab_size)
    eos_id = property(lambda self: self.engine.eos_id)
    add_bos = property(lambda self: self.engine.config.add_bos)
    num_blocks = property(lambda self: self.engine.num_blocks, doc="KV cache blocks")
    block_size = property(lambda self: self.engine.block_size, doc="tokens per KV block")
    backend = property(lambda self: self.engine.backend, doc="the paged attention backend")
    block_manager = property(lambda self: self.engine.block_manager)
    scheduler = property(lambda self: self.engine.scheduler)
    runner = property(lambda self: self.engine.runner)
    sampler = property(lambda self: self.engine.sampler)

    # ------------------------------------------------------------------ the serving API (the engine's)
    def add_request(self, prompt: Prompt, sampling_params=None, request_id: Optional[str] = None,
                    index: Optional[int] = None) -> str:
        """Queue a request; returns its id. Invalid requests are not raised: they finish with
        finish_reason "error" and come out of the next `step()`."""
        return self.engine.add_request(prompt, sampling_params, request_id, index)

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now (finish_reason "abort", reported by the next step); False if unknown."""
        return self.engine.abort_request(request_id)

    def step(self) -> list[StreamEvent]:
        """One engine step: an event for every request that produced tokens or finished."""
        return self.engine.step()

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests()

    def is_idle(self) -> bool:
        """Nothing to schedule and nothing to report: a step now would do nothing."""
        return self.engine.is_idle()

    def validate_request(self, prompt_ids: list[int], params=None) -> SamplingParams:
        """Raise a RequestError (with `param`, `code`) if the engine cannot serve this request."""
        return self.engine.validate_request(prompt_ids, params)

    def stats(self) -> dict:
        """Engine counters, KV cache use, prefix-cache hit rate and routing metrics (`LLMEngine.stats`)."""
        return self.engine.stats()

    def reset_stats(self) -> None:
        self.engine.reset_stats()

    def reset_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()

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
        return [self.engine.add_request(p, sp, index=i) if e is None else
                self.engine.add_failed_request(e, prompt=p if isinstance(p, str) else None, index=i)
                for i, (p, sp, e) in enumerate(zip(prompts, params, errors))]

    def _run(self, rids: list[str]) -> Iterator[StreamEvent]:
        pending = set(rids)
        try:
            while pending:
                events = self.engine.step()
                if not events and self.engine.is_idle():
                    raise RuntimeError(f"engine is idle but requests {sorted(pending)} never finished")
                for ev in events:
                    if ev.request_id in pending:
                        if ev.finished:
                            pending.discard(ev.request_id)
                        yield ev
        finally:  # the caller stopped early: do not leave its requests running
            for rid in pending:
                self.engine.drop_request(rid)

    def _collect(self, rids: list[str]) -> list[RequestOutput]:
        outputs: dict[str, RequestOutput] = {}
        for ev in self._run(rids):
            if ev.finished:
                outputs[ev.request_id] = ev.output
        return [outputs[r] for r in rids]

    def generate(self, prompts: Union[Prompt, Seq[Prompt]], sampling_params=None) -> list[RequestOutput]:
        """Generate for one prompt or a list (str or token ids); `sampling_params` is one
        SamplingParams (or dict) for all, or a list with one per prompt. Outputs keep the
        prompts' order. (Requests added with `add_request` also advance meanwhile, but their
        events are not returned: a server should drive `step()` itself.)"""
        return self._collect(self._add_batch(prompts, sampling_params))

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
