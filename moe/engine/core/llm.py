"""`LLM`: the offline front end of the engine, `LLMEngine` plus generate / chat / stream.

    llm = LLM("runs/x/checkpoints/step_0001000.pt")           # or LLM.from_model(model, tokenizer)
    outs = llm.generate(["Once upon a time"], SamplingParams(temperature=0.8, max_tokens=64))
    for ev in llm.stream(prompts, params): print(ev.text_delta, end="")
    llm.chat([{"role": "user", "content": "hi"}])
    rid = llm.add_request("...", params); events = llm.step()  # what a server loop does (LLMEngine's)

`LLM` is an `LLMEngine` (as nano-vllm's is): its parts and settings (`llm.config`, `llm.tokenizer`,
`llm.scheduler`, ...) and the serving API (`add_request`, `step`, `stats`, ...) are the engine's;
it adds loading a checkpoint, the batch calls and chat. The options (keywords of `LLM(...)` and `LLM.from_model(...)`) are the fields of
`moe.engine.config.EngineConfig`; an unknown one is a ConfigError naming it.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Optional, Sequence as Seq, Union

import torch

from moe.engine.config import EngineConfig
from moe.engine.core.engine import LLMEngine, Prompt
from moe.engine.offload.attach import ExpertOffload
from moe.engine.outputs import RequestOutput, StreamEvent
from moe.engine.parallel.launch import attach, start_ranks
from moe.engine.sampling.sampler import SamplingParams
from moe.errors import ConfigError, RequestError
from moe.loading import load_model, quantize_loaded
from moe.perf import device_defaults, set_tf32


def _is_single_prompt(prompts) -> bool:
    return isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and len(prompts) > 0
                                        and all(isinstance(t, int) for t in prompts))


class LLM(LLMEngine):
    """Options (all keyword; see `EngineConfig`): block_size (16); num_blocks /
    kv_cache_memory_bytes / kv_cache_memory_fraction (KV cache size; default: sized by the
    engine); enable_prefix_caching (True); max_num_seqs (64); max_num_batched_tokens (2048);
    max_model_len (the model's max_seq_len); attention_backend ("auto": triton on CUDA, torch on
    CPU; or "torch" | "triton" | "flash"); device, dtype (defaults: the model's; for a checkpoint
    CUDA + bf16 when available, else CPU + fp32); seed; add_bos (False); collect_routing_stats (True);
    speculative (None; "ngram" | "self" | {"method": "draft", "model": path, "num_tokens": 4, ...}:
    `moe.engine.config.SpeculativeConfig`, the default of requests that do not choose); compile
    (False: compiled static-shape decode steps, `moe.engine.runner.compiled`);
    kv_cache_dtype ("auto": the model's dtype; "fp8_e4m3": E4M3 with per-token, per-head scales);
    profile (None; {"steps": N, "dir": D}: torch.profiler over N model steps, `finish_profile()`
    writes a window stopped early; docs/guides/profiling.md); expert_cache (None; {"experts_per_layer": N}
    or {"memory": "8GB"}, "policy": lru | lfu | lookahead | ondemand: routed experts served from a
    memory-mapped slow tier through a per-layer cache; docs/guides/offload.md); tensor_parallel_size (1; T > 1 spawns
    T - 1 worker processes, `moe.engine.parallel`) and expert_parallel (False): docs/guides/multi_device.md.

    `routing` (not an engine option: it changes the model) serves the model routed differently,
    without retraining: {"top_k": 4, "drop_experts": [1, 5], "renormalize": False}, any subset
    (`Transformer.set_routing`). `quantization` (not an engine option either) serves the model
    quantized: a scheme name (`moe.quant.allowed_schemes()`; None / "none": as stored) or a dict
    `{"scheme": ..., <the scheme's options>}` (awq needs `calib_path`); docs/guides/quantization.md.
    """

    def __init__(self, checkpoint_path, routing: Optional[dict] = None, quantization=None, **opts):
        config = EngineConfig.from_options(opts)  # bad options fail before the checkpoint loads
        parallel = config.tensor_parallel_size > 1
        if parallel and quantization not in (None, "none"):
            raise ConfigError(f"quantization={quantization!r} is not supported with tensor_parallel_size="
                              f"{config.tensor_parallel_size}; use quantization=None or tensor_parallel_size=1")
        device = config.device
        if device is None:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = device_defaults(device, config.dtype, config.tf32, what="engine")  # None: auto (bf16 on CUDA, fp32 on CPU)
        group = workers = None
        if parallel:  # this rank's shard read in slices, ranks 1..T-1 spawned (moe/engine/parallel/launch.py)
            model, tokenizer, group, workers = start_ranks(checkpoint_path, config, device, dtype, routing)
        else:  # with expert_cache the model is loaded on the host: its experts go to the slow tier, the rest to `device`
            model, tokenizer, _cfg = load_model(checkpoint_path, device="cpu" if config.expert_cache else device,
                                                dtype=dtype, routing=routing, quantization=quantization)
        offload = ExpertOffload.attach(model, config.expert_cache, device, dtype) if config.expert_cache else None
        super().__init__(model, tokenizer, dataclasses.replace(config, device=device, dtype=dtype))
        self.offload = offload
        self._workers = workers
        if parallel:
            self.runner = attach(self, workers, group)

    def shutdown(self) -> None:
        """Stop the worker processes of a tensor-parallel engine (also done when it is collected)."""
        if getattr(self, "_workers", None) is not None:
            self._workers.stop()

    def validate_request(self, prompt_ids: list[int], params=None) -> SamplingParams:
        """`LLMEngine.validate_request`; a tensor-parallel engine also refuses speculative requests."""
        params = SamplingParams.coerce(params)
        if self.config.tensor_parallel_size > 1 and params.speculative not in (None, "off"):
            raise RequestError(f"speculative decoding is not supported with tensor_parallel_size="
                               f"{self.config.tensor_parallel_size}; send speculative=None", param="speculative")
        return super().validate_request(prompt_ids, params)

    @classmethod
    def from_model(cls, model, tokenizer=None, routing: Optional[dict] = None, quantization=None,
                   **opts) -> "LLM":
        """Serve an in-memory `Transformer` (put in eval mode; moved/cast in place only if
        `device`/`dtype` are given; its routing changed in place by `routing`, its weights
        quantized in place by `quantization`; with `expert_cache`, its experts modules replaced in place
        by offloaded ones). Without a tokenizer, prompts must be token ids."""
        config = EngineConfig.from_options(opts)
        if config.tensor_parallel_size > 1:
            raise ConfigError(f"tensor_parallel_size={config.tensor_parallel_size} needs a checkpoint path "
                              "(LLM(path, ...)): every rank loads its shard itself; LLM.from_model serves one process")
        if routing:
            model.set_routing(**routing)
        model = quantize_loaded(model, tokenizer, quantization)
        param = next(model.parameters())
        set_tf32(config.device or param.device, config.tf32)  # dtype: the model's unless given
        offload = None
        if config.expert_cache:
            offload = ExpertOffload.attach(model, config.expert_cache, config.device or param.device,
                                           config.dtype or param.dtype)
        self = cls.__new__(cls)
        LLMEngine.__init__(self, model, tokenizer, config)
        self.offload = offload
        return self

    def stats(self) -> dict:
        """`LLMEngine.stats()`, plus with `expert_cache` the `offload/...` keys (moe/engine/offload/stats.py)."""
        out = super().stats()
        if self.offload is not None:
            out.update(self.offload.stats())
        return out

    def reset_stats(self) -> None:
        super().reset_stats()
        if self.offload is not None:
            self.offload.reset_stats()

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
        return [self.add_request(p, sp, index=i) if e is None else
                self.add_failed_request(e, prompt=p if isinstance(p, str) else None, index=i)
                for i, (p, sp, e) in enumerate(zip(prompts, params, errors))]

    def _run(self, rids: list[str]) -> Iterator[StreamEvent]:
        pending = set(rids)
        try:
            while pending:
                events = self.step()
                if not events and self.is_idle():
                    raise RuntimeError(f"engine is idle but requests {sorted(pending)} never finished")
                for ev in events:
                    if ev.request_id in pending:
                        if ev.finished:
                            pending.discard(ev.request_id)
                        yield ev
        finally:  # the caller stopped early: do not leave its requests running
            for rid in pending:
                self.drop_request(rid)

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
