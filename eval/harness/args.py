"""The `moe_lab` back-end's model_args: checked once, an unknown name or a bad value a ConfigError.

    --model_args pretrained=<ckpt>,batch_size=16,router_top_k=1,quantization=int8,speculative=ngram

`pretrained` is anything `moe.load_model` reads (a checkpoint file, a run directory, an HF
directory). The back-end's own arguments are `BACKEND_ARGS`; the routing ablation is
`router_<name>` for each name of `moe.routing.options.ROUTING_OPTIONS` (`router_drop_experts` is
`;`-separated, since the harness splits model_args on commas); `quantization` is a scheme of
`moe.quant` (`quant_group_size`, `quant_calib_path` its options); every other name must be an
engine option (`moe.engine.config.EngineConfig`: dtype, device, speculative, block_size,
max_num_seqs, kv_cache_dtype, enable_prefix_caching, ...), passed through to the engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from moe.engine.config import EngineConfig
from moe.errors import ConfigError
from moe.routing.options import ROUTING_OPTIONS

# The back-end's own arguments and what they mean (the names the harness's `hf` back-end uses
# where it has one). `max_batch_size` is accepted and ignored: the harness passes it to every model.
BACKEND_ARGS = {
    "pretrained": "the checkpoint: file, run directory or HF directory (required)",
    "batch_size": "log-likelihood rows per forward (default 32; 'auto' = 32)",
    "max_batch_size": "ignored (the harness passes it to every back-end)",
    "max_length": "context window of the scored requests (default: the model's max_seq_len)",
    "max_gen_toks": "generate_until's default max new tokens (default 256, as hf)",
    "quantization": "a moe.quant scheme: int8 | int4 | awq | fp8 | fp8_weight | none",
    "quant_group_size": "group size of the quantization scheme (default 128)",
    "quant_calib_path": "awq's calibration text",
    "trust_remote_code": "ignored (nothing remote is run)",
}
ROUTING_ARGS = {f"router_{name}": name for name in ROUTING_OPTIONS}
DEFAULT_BATCH_SIZE = 32
DEFAULT_MAX_GEN_TOKS = 256


@dataclass
class BackendArgs:
    pretrained: Optional[str]
    batch_size: int = DEFAULT_BATCH_SIZE
    max_length: Optional[int] = None
    max_gen_toks: int = DEFAULT_MAX_GEN_TOKS
    routing: dict = field(default_factory=dict)
    quantization: Any = None  # None, or a dict of moe.quant.QuantSpec fields
    engine: dict = field(default_factory=dict)  # EngineConfig options


def known_args() -> list[str]:
    return sorted(set(BACKEND_ARGS) | set(ROUTING_ARGS) | set(EngineConfig.option_names()))


def _positive_int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"model_args {name}={v!r} must be a positive int")
    return v


def _routing_value(name: str, v: Any) -> Any:
    if name == "top_k":
        return _positive_int("router_top_k", v)
    if name == "renormalize":
        if not isinstance(v, bool):
            raise ConfigError(f"model_args router_renormalize={v!r} must be true or false")
        return v
    items = [v] if isinstance(v, int) and not isinstance(v, bool) else str(v).replace(";", " ").split()
    try:
        return [int(e) for e in items]
    except ValueError:
        raise ConfigError(f"model_args router_drop_experts={v!r} must be expert ids separated by ';', "
                          "e.g. router_drop_experts=1;5") from None


def _engine_value(name: str, v: Any) -> Any:
    if name == "speculative" and isinstance(v, str) and v.strip().startswith("{"):
        try:
            return json.loads(v)
        except json.JSONDecodeError as e:
            raise ConfigError(f"model_args speculative={v!r} is not a JSON object ({e})") from None
    return v


def parse_backend_args(args: dict[str, Any]) -> BackendArgs:
    """The checked arguments of `args` (model_args as the harness parsed them, plus its
    batch_size / max_batch_size / device)."""
    unknown = sorted(set(args) - set(known_args()))
    if unknown:
        raise ConfigError(f"unknown moe_lab model_args {unknown}; the back-end's: {sorted(BACKEND_ARGS)}, routing: "
                          f"{sorted(ROUTING_ARGS)}, and the engine options {EngineConfig.option_names()}")
    out = BackendArgs(pretrained=None if args.get("pretrained") is None else str(args["pretrained"]))
    batch_size = args.get("batch_size")
    if batch_size is not None and str(batch_size) != "auto" and not str(batch_size).startswith("auto:"):
        out.batch_size = _positive_int("batch_size", int(batch_size) if str(batch_size).isdigit() else batch_size)
    if args.get("max_length") is not None:
        out.max_length = _positive_int("max_length", args["max_length"])
    if args.get("max_gen_toks") is not None:
        out.max_gen_toks = _positive_int("max_gen_toks", args["max_gen_toks"])
    out.routing = {ROUTING_ARGS[k]: _routing_value(ROUTING_ARGS[k], v) for k, v in args.items()
                   if k in ROUTING_ARGS and v is not None}
    scheme = args.get("quantization")
    if scheme is not None and str(scheme) != "none":
        out.quantization = {"scheme": str(scheme)}
        if args.get("quant_group_size") is not None:
            out.quantization["group_size"] = _positive_int("quant_group_size", args["quant_group_size"])
        if args.get("quant_calib_path") is not None:
            out.quantization["calib_path"] = str(args["quant_calib_path"])
    out.engine = {k: _engine_value(k, v) for k, v in args.items()
                  if k in EngineConfig.option_names() and v is not None}
    EngineConfig.from_options(out.engine)  # a bad engine option: its ConfigError, before anything loads
    return out
