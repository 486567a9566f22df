"""Weight quantization (int8, int4, AWQ, FP8) of a loaded `Transformer`: docs/guides/quantization.md.

Schemes are registered by name in `QUANT_SCHEMES` (one module each in `moe/quant/schemes/`, with its options and kernel format); `quantize_model`
applies one to attention projections, experts and dense FFNs; a quantized checkpoint records its
`QuantSpec` and loads through `moe.load_model` like any other.
"""

from moe.quant.apply import (NONE, QuantSpec, allowed_schemes, quantize_model, quantized_skeleton, sweep_specs,
                             weight_bytes)
from moe.quant.calibration import calibration_ids
from moe.quant.modules import QuantExperts, QuantLinear
from moe.quant.schemes import QUANT_SCHEMES, Scheme, get_scheme, quantize_activation

__all__ = ["NONE", "QUANT_SCHEMES", "QuantExperts", "QuantLinear", "QuantSpec", "Scheme", "allowed_schemes",
           "calibration_ids", "get_scheme", "quantize_activation", "quantize_model", "quantized_skeleton",
           "sweep_specs", "weight_bytes"]
