"""The engine's options, each checked once when its config is made: `EngineConfig` (every
engine option) and `SpeculativeConfig` (how a request, or the whole engine, decodes speculatively).

    EngineConfig(block_size=16, max_num_seqs=64)         # what `LLM(path, **opts)` builds from its options
    EngineConfig.from_options({"max_num_seqs": 8})      # unknown option names are a ConfigError

What depends on the model (the default `max_model_len`, the KV cache size, whether the backend
runs this head size) is settled when the engine is built; everything that can be checked
without the model is checked here, with a ConfigError naming the field and the allowed values.

    LLM(path, speculative="ngram")                                    # engine-wide default
    LLM(path, speculative={"method": "draft", "model": "runs/small"}) # a second, smaller checkpoint
    SamplingParams(speculative={"method": "self", "top_k": 1})        # per request
    SamplingParams(speculative="off")                                  # this request: plain decoding

Speculative methods: `ngram` (prompt lookup: the continuation of the longest earlier match of the
context's last n tokens), `draft` (a smaller model with the same tokenizer; it is set engine-wide,
a request can only choose it), `self` (the served model itself with a reduced router `top_k`
and/or `skip_layers` drafts; the full model verifies), `mtp` (the served model's own multi-token-prediction
modules, `model.mtp_depth`, draft; the last one chained for k > depth). The machinery is `moe.engine.speculative`;
the options live here, at the bottom of the engine, because `SamplingParams` and `EngineConfig`
carry them and the speculative machinery itself builds on sampling.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from typing import Any, Optional, Union

import torch

from moe.attention import PAGED_BACKENDS
from moe.dtypes import resolve_dtype
from moe.engine.offload.options import ExpertCacheConfig
from moe.errors import ConfigError, check_option_names

KV_CACHE_DTYPES = ("auto", "fp8_e4m3")  # "fp8_e4m3": the FP8 KV cache of moe/engine/runner/kv_fp8.py

METHODS = ("ngram", "draft", "self", "mtp")
OFF = "off"


@dataclass
class SpeculativeConfig:
    method: str
    num_tokens: int = 4  # k: tokens proposed per step, all verified in one forward
    prompt_lookup_max: int = 4  # ngram: longest n-gram matched
    prompt_lookup_min: int = 1  # ngram: shortest n-gram matched
    model: Any = None  # draft: a checkpoint path or an in-memory Transformer (engine-wide only)
    top_k: Optional[int] = 1  # self: the router top_k of the drafting pass (None: the model's)
    skip_layers: tuple = ()  # self: indices of the layers the drafting pass skips

    def __post_init__(self):
        if self.method not in METHODS:
            raise ConfigError(f"speculative.method={self.method!r} is unknown; choose one of {list(METHODS)} "
                              f"(or {OFF!r} on a request to turn speculation off)")
        for name in ("num_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ConfigError(f"speculative.{name}={v!r} must be a positive int")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigError(f"speculative.prompt_lookup_min={self.prompt_lookup_min} must be <= "
                              f"prompt_lookup_max={self.prompt_lookup_max}")
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            raise ConfigError(f"speculative.top_k={self.top_k!r} must be a positive int or None (the model's)")
        if isinstance(self.skip_layers, int) and not isinstance(self.skip_layers, bool):
            self.skip_layers = (self.skip_layers,)
        if not isinstance(self.skip_layers, (list, tuple)) or not all(_is_int(i) and i >= 0 for i in self.skip_layers):
            raise ConfigError(f"speculative.skip_layers={self.skip_layers!r} must be a list of layer indices (ints >= 0)")
        self.skip_layers = tuple(sorted(set(self.skip_layers)))
        if self.method == "draft" and self.model is not None and not isinstance(self.model, str) \
                and not hasattr(self.model, "cfg"):
            raise ConfigError(f"speculative.model must be a checkpoint path or a Transformer; got "
                              f"{type(self.model).__name__}")
        if self.method != "draft" and self.model is not None:
            raise ConfigError(f"speculative.model is the draft model of method 'draft'; method={self.method!r} "
                              "takes none")

    @property
    def key(self) -> tuple:
        """What needs its own proposer (and KV cache): the drafting model, not k."""
        if self.method == "ngram":
            return ("ngram",)
        if self.method in ("draft", "mtp"):
            return (self.method,)
        return ("self", self.top_k, self.skip_layers)

    @classmethod
    def coerce(cls, v, allow_off: bool = False) -> Optional["SpeculativeConfig | str"]:
        """A config from None, a method name, a dict of fields, or a config; `"off"` (requests
        only, `allow_off`) is kept as is. Raises a ConfigError naming the field."""
        if v is None or isinstance(v, cls):
            return v
        if isinstance(v, str):
            if v == OFF and allow_off:
                return OFF
            return cls(method=v)
        if isinstance(v, dict):
            check_option_names(v, [f.name for f in fields(cls)], "speculative")
            if "method" not in v:
                raise ConfigError(f"speculative needs a 'method': one of {list(METHODS)}")
            return cls(**v)
        raise ConfigError(f"speculative must be a method name {list(METHODS)}, a dict of options or a "
                          f"SpeculativeConfig; got {type(v).__name__}")


@dataclass
class EngineProfile:
    """`profile=`: torch.profiler over `steps` model steps after the first `skip` (the first steps
    allocate and warm caches; the last skipped one is the profiler's warm-up), written into `dir`
    (moe/engine/core/profile.py; docs/guides/profiling.md)."""

    steps: int
    dir: str = "profile"
    skip: int = 1
    top_ops: int = 15
    memory: bool = True

    def __post_init__(self):
        for name, low in (("steps", 1), ("skip", 0), ("top_ops", 1)):
            v = getattr(self, name)
            if not _is_int(v) or v < low:
                raise ConfigError(f"profile.{name}={v!r} must be an int >= {low}")
        if not isinstance(self.dir, (str, os.PathLike)) or not str(self.dir):
            raise ConfigError(f"profile.dir={self.dir!r} must be a directory path")
        if not isinstance(self.memory, bool):
            raise ConfigError(f"profile.memory={self.memory!r} must be True or False")

    @classmethod
    def coerce(cls, v) -> Optional["EngineProfile"]:
        """None, a config, or a dict of its fields (`{"steps": 5, "dir": "traces"}`)."""
        if v is None or isinstance(v, cls):
            return v
        if not isinstance(v, dict):
            raise ConfigError(f"profile={v!r} must be a dict such as {{'steps': 5, 'dir': 'traces'}}, or None")
        check_option_names(v, [f.name for f in fields(cls)], "profile")
        if "steps" not in v:
            raise ConfigError("profile needs 'steps': the number of engine steps to record")
        return cls(**v)


def speculative_option(text: Optional[str]):
    """A command line's `--speculative` value: None, a method name, or a JSON object of options."""
    if text is None or not text.strip().startswith("{"):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--speculative {text!r} is not a JSON object ({e}); give a method name "
                          f"{list(METHODS)} or e.g. '{{\"method\": \"ngram\", \"num_tokens\": 4}}'") from None


@dataclass
class EngineConfig:
    block_size: int = 16  # tokens per KV block
    # KV cache size, first of: num_blocks; kv_cache_memory_bytes; kv_cache_memory_fraction of
    # the free memory; else 80% of free GPU memory on CUDA, and on CPU enough blocks for
    # max_num_seqs full-length sequences (at most a quarter of the available RAM).
    num_blocks: Optional[int] = None
    kv_cache_memory_bytes: Optional[int] = None
    kv_cache_memory_fraction: Optional[float] = None
    enable_prefix_caching: bool = True
    max_num_seqs: int = 64  # running sequences per step
    max_num_batched_tokens: int = 2048  # tokens per step (decodes + prefill chunks)
    max_model_len: Optional[int] = None  # None: the model's max_seq_len
    # A max_model_len past the model's context (max_seq_len, or what model.rope_scaling extends it to)
    # is a ConfigError unless this is set (vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN): then only a warning.
    allow_long_context: bool = False
    attention_backend: str = "auto"  # "auto" (triton on CUDA, torch elsewhere) or a registered paged backend
    device: Optional[Union[str, torch.device]] = None  # None: the model's (made a torch.device here)
    # None / "auto": the model's (from_model), else bf16 on CUDA, fp32 on CPU (moe.perf.device_defaults)
    dtype: Optional[Union[str, torch.dtype]] = None
    tf32: bool = True  # on CUDA, fp32 matmuls may use TF32 tensor cores (moe.perf.set_tf32; torch's default is off)
    seed: Optional[int] = None  # engine RNG for requests without their own seed
    add_bos: bool = False  # prompts are encoded as the training data was: without BOS
    collect_routing_stats: bool = True  # the `moe/...` keys of `stats()`
    # speculative decoding for requests that do not choose (SpeculativeConfig above): None (off), a method
    # name ("ngram" | "draft" | "self" | "mtp"), a dict of SpeculativeConfig options or a SpeculativeConfig
    speculative: Any = None
    compile: bool = False  # static-shape compiled decode steps over padded batch buckets (moe.engine.runner.compiled)
    kv_cache_dtype: str = "auto"  # "auto" (the model's dtype) or "fp8_e4m3" (moe/engine/runner/kv_fp8.py)
    # debug: assert the scheduler's and block manager's invariants after every step (moe/engine/core/invariants.py);
    # off unless MOE_CHECK_INVARIANTS=1 (the test suite sets it), since each check walks the whole cache
    check_invariants: bool = field(default_factory=lambda: os.environ.get("MOE_CHECK_INVARIANTS", "") == "1")
    # torch.profiler over some model steps: None, or EngineProfile's fields ({"steps": 5, "dir": "traces"})
    profile: Any = None
    # expert offloading (moe/engine/offload/, docs/guides/offload.md): None, or ExpertCacheConfig's fields
    # ({"experts_per_layer": 2} or {"memory": "8GB"}, "policy": lru | lfu | lookahead | ondemand)
    expert_cache: Any = None
    # Tensor-parallel inference over this many processes (moe/engine/parallel/, docs/guides/multi_device.md):
    # attention heads, the KV cache, dense FFNs and the vocabulary split across ranks. expert_parallel:
    # each rank holds n_experts / tensor_parallel_size whole experts instead of a slice of every expert.
    tensor_parallel_size: int = 1
    expert_parallel: bool = False

    def __post_init__(self):
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size"):
            _positive_int(self, name)
        for name in ("num_blocks", "kv_cache_memory_bytes"):
            if getattr(self, name) is not None:
                _positive_int(self, name, "or None (sized by the engine)")
        f = self.kv_cache_memory_fraction
        if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1):
            raise ConfigError(f"kv_cache_memory_fraction={f!r} must be in (0, 1], or None")
        if self.max_model_len is not None:
            v = self.max_model_len
            if not _is_int(v) or v < 2:
                raise ConfigError(f"max_model_len={v!r} must be an int >= 2, or None (the model's max_seq_len)")
        name = self.attention_backend
        if not isinstance(name, str):
            raise ConfigError(f"attention_backend={name!r} must be a string: 'auto' or one of {list(PAGED_BACKENDS)}")
        if name != "auto":
            try:
                PAGED_BACKENDS.lookup(name)  # the registry checks the name (availability: when built)
            except ConfigError as e:
                raise ConfigError(f"{e}, or 'auto'") from None
        if self.device is not None:
            try:
                self.device = torch.device(self.device)
            except (RuntimeError, TypeError):
                raise ConfigError(f"device={self.device!r} is not a torch device: use e.g. 'cpu', 'cuda', "
                                  "'cuda:1', or None (the model's)") from None
        self.dtype = None if str(self.dtype).lower() == "auto" else resolve_dtype(self.dtype)  # auto: as None
        if self.seed is not None and not _is_int(self.seed):
            raise ConfigError(f"seed={self.seed!r} must be an int or None")
        try:
            self.speculative = SpeculativeConfig.coerce(self.speculative)
        except ConfigError as e:
            raise ConfigError(f"speculative={self.speculative!r}: {e}") from None
        self.profile = EngineProfile.coerce(self.profile)
        self.expert_cache = ExpertCacheConfig.coerce(self.expert_cache)
        if self.compile and self.expert_cache is not None:
            # a cache miss is a host-side decision mid-forward; the compiled runner's graphs have none
            raise ConfigError("expert_cache is not supported with compile=True; use compile=False or drop expert_cache")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache_dtype={self.kv_cache_dtype!r} is not allowed; choose one of "
                              f"{list(KV_CACHE_DTYPES)}")
        for name in ("enable_prefix_caching", "add_bos", "collect_routing_stats", "compile", "allow_long_context",
                     "check_invariants", "tf32", "expert_parallel"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.compile and self.kv_cache_dtype != "auto":
            # The compiled runner's static graphs are built and tested over the full-precision cache only.
            raise ConfigError(f"kv_cache_dtype={self.kv_cache_dtype!r} is not supported with compile=True; "
                              "use kv_cache_dtype='auto' or compile=False")
        if self.compile and self.speculative is not None and self.speculative.method == "mtp":
            # MTP drafts from the hidden states of the served model's eager forwards (moe/engine/speculative/mtp.py)
            raise ConfigError("speculative method 'mtp' is not supported with compile=True; use compile=False or "
                              "another method")

        if self.tensor_parallel_size > 1:
            self._check_parallel_combinations()
        elif self.expert_parallel:  # would be silently ignored on one process
            raise ConfigError("expert_parallel=True needs tensor_parallel_size > 1 (the experts are placed across "
                              "its ranks); got tensor_parallel_size=1")

    def _check_parallel_combinations(self) -> None:
        """Options the multi-process engine does not run (yet): one error naming both options."""
        refused = [(self.compile, "compile=True"),
                   (self.speculative is not None, f"speculative={self.speculative and self.speculative.method!r}"),
                   (self.kv_cache_dtype != "auto", f"kv_cache_dtype={self.kv_cache_dtype!r}"),
                   (self.expert_cache is not None, "expert_cache")]
        for bad, shown in refused:
            if bad:
                raise ConfigError(f"{shown} is not supported with tensor_parallel_size={self.tensor_parallel_size} "
                                  "(the parallel engine runs the eager full-precision path without speculation); "
                                  "use tensor_parallel_size=1 or drop the option")

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_options(cls, opts: dict[str, Any]) -> "EngineConfig":
        """The config of keyword options (as `LLM(path, **opts)` takes them); an unknown name is
        a ConfigError listing the known ones (a typo must not silently fall back to a default)."""
        check_option_names(opts, cls.option_names(), "engine")
        return cls(**opts)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive_int(cfg: EngineConfig, name: str, alternative: str = "") -> None:
    v = getattr(cfg, name)
    if not _is_int(v) or v < 1:
        raise ConfigError(f"{name}={v!r} must be a positive int" + (f" {alternative}" if alternative else ""))

