"""`SpeculativeConfig`: how a request (or the whole engine) decodes speculatively.

    LLM(path, speculative="ngram")                                    # engine-wide default
    LLM(path, speculative={"method": "draft", "model": "runs/small"}) # a second, smaller checkpoint
    SamplingParams(speculative={"method": "self", "top_k": 1})        # per request
    SamplingParams(speculative="off")                                  # this request: plain decoding

Methods: `ngram` (prompt lookup: the continuation of the longest earlier match of the context's
last n tokens), `draft` (a smaller model with the same tokenizer; it is set engine-wide, a
request can only choose it), `self` (the served model itself with a reduced router `top_k` and/or
`skip_layers` drafts; the full model verifies). The engine machinery is `moe.engine.spec`; this
module only holds the validated options, so `SamplingParams` can carry them without importing it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Optional

from moe.errors import ConfigError

METHODS = ("ngram", "draft", "self")
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
        if self.method == "draft":
            return ("draft",)
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
            names = [f.name for f in fields(cls)]
            unknown = sorted(set(v) - set(names))
            if unknown:
                raise ConfigError(f"unknown speculative option(s) {unknown}; the options are {names}")
            if "method" not in v:
                raise ConfigError(f"speculative needs a 'method': one of {list(METHODS)}")
            return cls(**v)
        raise ConfigError(f"speculative must be a method name {list(METHODS)}, a dict of options or a "
                          f"SpeculativeConfig; got {type(v).__name__}")


def speculative_option(text: Optional[str]):
    """A command line's `--speculative` value: None, a method name, or a JSON object of options."""
    if text is None or not text.strip().startswith("{"):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--speculative {text!r} is not a JSON object ({e}); give a method name "
                          f"{list(METHODS)} or e.g. '{{\"method\": \"ngram\", \"num_tokens\": 4}}'") from None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
