"""What a weight-quantization scheme is (`Scheme`), the registry of them, and the FP8 activation
rounding that the W8A8 scheme and the kernels share.

A scheme turns a weight `w [..., O, I]` (a 2-D projection, or the 3-D grouped expert weights
`[E, O, I]`: the leading dims are carried through, every output row is quantized along its
input dim) into the tensors that are stored (`quantize`), and back (`dequantize`). It declares:

* `Config`: a dataclass of its own options (`quant.<option>`), or none; `QuantSpec` merges the
  user's options onto it and refuses one the scheme does not have, naming it;
* `kernel_format`: the stored layout the Triton weight-only GEMMs read (`kernels/quant_gemm`:
  int8 | int4 | fp8; `kernels/mxfp4_gemm`: mxfp4), or None to always take the dequantise-then-matmul path;
* `act_fp8` (activations rounded per token to E4M3) and `searches_scales` (AWQ: calibrated);
* `quantizes_linears`: False when only the experts are quantized (mxfp4 by default).

The math is the standard affine/symmetric quantization that torchao's `choose_qparams_affine` /
`quantize_affine` / `dequantize_affine` implement (tests/quant/test_schemes.py checks ours
against them and against a plain loop). It is written here rather than imported: importing
torchao costs ~8 s and prints library-load warnings on CPU builds, for ten lines of arithmetic,
and its block quantizers take whole tensors while the grouped expert weights need their leading
expert dim carried through (and a last group shorter than `group_size` when the input dim is not
a multiple of it: padded with zeros here, which the asymmetric range always contains).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional

import torch

from moe.errors import ConfigError
from moe.registry import Registry

QUANT_SCHEMES: Registry = Registry("quantization", package="moe.quant.schemes")

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
EPS = 1e-12


class Scheme:
    """A registered scheme: `quantize(w) -> {name: tensor}` and `dequantize(tensors, in_features, dtype)`,
    built from its options (`config`, an instance of its `Config`; None when it has none)."""

    name: ClassVar[str] = "base"
    bits: ClassVar[int] = 16
    kernel_format: ClassVar[Optional[str]] = None  # the layout kernels/quant_gemm reads; None: never the kernels
    act_fp8: ClassVar[bool] = False  # activations quantized per token to E4M3 before each matmul
    searches_scales: ClassVar[bool] = False  # AWQ: needs calibration activations

    def __init__(self, config: Any = None):
        own = getattr(type(self), "Config", None)
        self.config = config if config is not None or own is None else own()

    @property
    def group_size(self) -> Optional[int]:
        """Inputs per scale of a grouping scheme (int4, awq); None for per-channel ones."""
        return getattr(self.config, "group_size", None)

    @property
    def quantizes_linears(self) -> bool:
        """Whether the attention projections and dense FFNs are quantized too, or the experts only
        (mxfp4's default, as GPT-OSS ships)."""
        return True

    def quantize(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def dequantize(self, q: dict[str, torch.Tensor], in_features: int, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def fake_quantize(self, w: torch.Tensor) -> torch.Tensor:
        """quantize then dequantize (what the model computes with), in w's dtype."""
        return self.dequantize(self.quantize(w), w.shape[-1], w.dtype)


def positive_int(field: str, value: Any) -> None:
    """A ConfigError naming `quant.<field>` unless `value` is an int >= 1 (bools are not)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"quant.{field}={value!r} must be a positive int")


def get_scheme(name: str, group_size: Optional[int] = None) -> Scheme:
    """Scheme `name` with its default options, `group_size` set where the scheme groups inputs (for
    code that loops over schemes: tests, benchmarks). User options go through `QuantSpec`, which
    refuses an option the scheme does not have."""
    cls = QUANT_SCHEMES.lookup(name)
    config = getattr(cls, "Config", None)
    if group_size is None or config is None or "group_size" not in {f.name for f in dataclasses.fields(config)}:
        return cls()
    return cls(config(group_size=group_size))


def quantize_activation_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token E4M3 quantization of activations `[..., D]`: `(codes float8_e4m3fn [..., D],
    scales fp32 [...])`, scale = token amax / 448 (what an FP8 tensor-core GEMM consumes)."""
    x32 = x.float()
    scale = (x32.abs().amax(-1, keepdim=True) / FP8_MAX).clamp(min=EPS)
    return (x32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale.squeeze(-1)


def quantize_activation(x: torch.Tensor) -> torch.Tensor:
    """Dynamic per-token E4M3 quantize-dequantize of activations `[..., D]` (scale = token amax / 448)."""
    q, scale = quantize_activation_fp8(x)
    return (q.float() * scale.unsqueeze(-1)).to(x.dtype)
