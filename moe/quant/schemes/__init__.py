"""Weight quantization schemes, one module each, registered by name in `QUANT_SCHEMES`
(`quantization=<name>`), which imports every module of this package when first asked. A scheme
owns its options (`Config`) and its kernel layout (`kernel_format`): see `base.py`."""

from moe.quant.schemes.base import (FP8_DTYPE, FP8_MAX, QUANT_SCHEMES, Scheme, get_scheme, quantize_activation,
                                    quantize_activation_fp8)
from moe.quant.schemes.int4 import _pack_int4, _unpack_int4

__all__ = ["FP8_DTYPE", "FP8_MAX", "QUANT_SCHEMES", "Scheme", "_pack_int4", "_unpack_int4", "get_scheme",
           "quantize_activation", "quantize_activation_fp8"]
