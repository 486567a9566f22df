"""Quantized weights in the memory plan: `python -m moe.engine.memory.plan <model> --quant mxfp4|int8|...|auto`.

The planner builds the model on the meta device and gives it the module structure of
`moe.quant.quantize_model(model, scheme)` (`quantized_skeleton`: no values computed), so each
quantized weight is counted at the bytes the scheme stores (codes, scales, zero points: mxfp4 is
4.25 bits a weight, an e2m1 code and one e8m0 scale per 32) and every other weight (norms, router,
embeddings, LM head; and, for mxfp4 by default, the attention) at `--dtype`. The count is
`moe.quant.weight_bytes`, the function that counts a really quantized model's bytes
(tests/engine/memory/test_plan_quant.py checks the two agree on a small model).

`auto` reads the config's `quantization_config.quant_method` (GPT-OSS ships `mxfp4` experts); a
config without one plans unquantized. `none` (the default) counts every weight at `--dtype`: what
the engine holds when it loads a checkpoint without `quantization=` (GPT-OSS's MXFP4 experts are
dequantised at load).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from moe.engine.memory.memory_profile import gib
from moe.errors import ConfigError
from moe.meta import meta_device
from moe.model import Transformer
from moe.quant import NONE, QuantSpec, allowed_schemes, quantized_skeleton

AUTO = "auto"
# quant_method of an HF quantization_config -> the moe.quant scheme that stores it as shipped
HF_METHODS = {"mxfp4": "mxfp4"}


def quant_choices() -> list[str]:
    return [AUTO, *allowed_schemes()]


def shipped_method(model_path: str) -> Optional[str]:
    """The `quantization_config.quant_method` of the HF config at `model_path` (a directory or its
    config.json), or None when it has none."""
    p = Path(model_path).expanduser()
    p = p / "config.json" if p.is_dir() else p
    try:
        quant = json.loads(p.read_text()).get("quantization_config")
    except (OSError, ValueError):
        return None  # read_model_config reports an unreadable config with its own message
    return quant.get("quant_method") if isinstance(quant, dict) else None


def resolve_quant(option: str, model_path: str) -> str:
    """`--quant` -> a moe.quant scheme name (or 'none'); `auto` follows the shipped config."""
    if option not in quant_choices():
        raise ConfigError(f"--quant={option!r} is unknown; choose one of {quant_choices()}")
    if option != AUTO:
        return option
    method = shipped_method(model_path)
    if method is None:
        return NONE
    if method not in HF_METHODS:
        raise ConfigError(f"--quant=auto: quantization_config.quant_method={method!r} of {model_path} has no "
                          f"moe.quant scheme (known: {sorted(HF_METHODS)}); pass --quant explicitly, one of "
                          f"{allowed_schemes()}")
    return HF_METHODS[method]


def check_quantizable(cfg, quant: str) -> None:
    """The refusals of `moe.quant.quantize_model` that depend on the model alone (AWQ's scale search:
    grouped-query attention and plain SwiGLU experts only), so a plan is never made for what the
    engine would refuse to load."""
    if quant == NONE or not QuantSpec(quant).build().searches_scales:
        return
    if cfg.attention_kind != "mha":
        raise ConfigError(f"--quant={quant} is not supported with model.attention_kind={cfg.attention_kind!r}: its "
                          "scale search folds into grouped-query attention's fused qkv_proj; use an RTN scheme")
    if cfg.expert_bias or cfg.expert_activation != "swiglu":
        raise ConfigError(f"--quant={quant} is not supported with model.expert_activation={cfg.expert_activation!r} / "
                          f"model.expert_bias={cfg.expert_bias!r} (GPT-OSS experts): its scale search models plain "
                          "SwiGLU experts; use an RTN scheme (mxfp4, int4, int8, fp8)")


def planned_model(cfg, dtype: torch.dtype, quant: str = NONE) -> torch.nn.Module:
    """The model of `cfg` on the meta device, in `dtype`, with `quant`'s quantized modules."""
    check_quantizable(cfg, quant)
    with meta_device():
        model = Transformer(cfg).to(dtype).eval()
    quantized_skeleton(model, QuantSpec(quant))
    return model


def quant_lines(quant: str, counted: dict[str, int], shipped: Optional[str]) -> list[str]:
    if quant == NONE:
        if shipped is None:
            return []
        return [f"(the config ships {shipped} weights; counted at --dtype here, as the engine holds them when it "
                "loads without quantization=; --quant auto counts them as shipped)"]
    return [f"(weights quantized {quant}: {gib(counted['quantized'])} stored codes and scales, "
            f"{gib(counted['full_precision'])} at --dtype)"]
