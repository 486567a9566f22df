"""Weight quantization schemes, registered by name (`quantization=<name>`).

A scheme turns a weight `w [..., O, I]` (a 2-D projection, or the 3-D grouped expert weights
`[E, O, I]`: the leading dims are carried through, every output row is quantized along its
input dim) into the tensors that are stored (`quantize`), and back (`dequantize`):

    int8        weight-only, symmetric, one fp32 scale per output channel: q = round(w / s), s = amax / 127
    int4        weight-only round-to-nearest, asymmetric: per (row, group of `group_size` inputs) an fp32
                scale and a uint8 zero point in [0, 15]; two 4-bit codes packed per byte
    awq         int4's storage; the weights were scaled by AWQ's activation-aware search first (moe/quant/awq.py)
    fp8         E4M3 weights with one fp32 scale per output channel (s = amax / 448) AND dynamic per-token
                E4M3 activations (W8A8; `quantize_activation`)
    fp8_weight  the same weights, activations left in full precision

The math is the standard affine/symmetric quantization that torchao's `choose_qparams_affine` /
`quantize_affine` / `dequantize_affine` implement (tests/quant/test_schemes.py checks ours
against them and against a plain loop). It is written here rather than imported: importing
torchao costs ~8 s and prints library-load warnings on CPU builds, for ten lines of arithmetic,
and its block quantizers take whole tensors while the grouped expert weights need their leading
expert dim carried through (and a last group shorter than `group_size` when the input dim is not
a multiple of it: padded with zeros here, which the asymmetric range always contains).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from moe.registry import Registry

QUANT_SCHEMES: Registry = Registry("quantization")

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
_EPS = 1e-12


class Scheme:
    """A registered scheme: `quantize(w) -> {name: tensor}` and `dequantize(tensors, in_features, dtype)`."""

    name: ClassVar[str] = "base"
    bits: ClassVar[int] = 16
    act_fp8: ClassVar[bool] = False  # activations quantized per token to E4M3 before each matmul
    searches_scales: ClassVar[bool] = False  # AWQ: needs calibration activations

    def __init__(self, group_size: int = 128):
        self.group_size = group_size

    def quantize(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def dequantize(self, q: dict[str, torch.Tensor], in_features: int, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def fake_quantize(self, w: torch.Tensor) -> torch.Tensor:
        """quantize then dequantize (what the model computes with), in w's dtype."""
        return self.dequantize(self.quantize(w), w.shape[-1], w.dtype)


@QUANT_SCHEMES.register("int8")
class Int8(Scheme):
    name, bits = "int8", 8

    def quantize(self, w):
        w = w.float()
        scale = (w.abs().amax(-1, keepdim=True) / 127.0).clamp(min=_EPS)
        return {"qweight": torch.round(w / scale).clamp(-127, 127).to(torch.int8), "scale": scale}

    def dequantize(self, q, in_features, dtype):
        return (q["qweight"].float() * q["scale"]).to(dtype)


def _pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes in [0, 15], last dim even -> bytes holding two codes (low nibble first)."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def _unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


@QUANT_SCHEMES.register("int4")
class Int4(Scheme):
    """Round-to-nearest asymmetric int4 with zero points (AWQ's / torchao's convention: the range
    [min(w, 0), max(w, 0)] of each group maps onto 0..15)."""

    name, bits = "int4", 4

    def _groups(self, in_features: int) -> tuple[int, int]:
        g = self.group_size
        return -(-in_features // g), g

    def quantize(self, w):
        *lead, O, I = w.shape
        n_groups, g = self._groups(I)
        w = w.float()
        if n_groups * g != I:  # a short last group: zero padding (0 is always inside the range)
            w = torch.nn.functional.pad(w, (0, n_groups * g - I))
        w_g = w.reshape(*lead, O, n_groups, g)
        lo = w_g.amin(-1).clamp(max=0)
        hi = w_g.amax(-1).clamp(min=0)
        scale = ((hi - lo) / 15.0).clamp(min=_EPS)
        zero = torch.round(-lo / scale).clamp(0, 15)
        codes = (torch.round(w_g / scale.unsqueeze(-1)) + zero.unsqueeze(-1)).clamp(0, 15).to(torch.uint8)
        return {"qweight": _pack_int4(codes.reshape(*lead, O, n_groups * g)), "scale": scale,
                "zero": zero.to(torch.uint8)}

    def dequantize(self, q, in_features, dtype):
        scale, zero = q["scale"], q["zero"]
        *lead, O, n_groups = scale.shape
        codes = _unpack_int4(q["qweight"]).reshape(*lead, O, n_groups, -1).float()
        w = (codes - zero.unsqueeze(-1).float()) * scale.unsqueeze(-1)
        return w.reshape(*lead, O, -1)[..., :in_features].to(dtype)


@QUANT_SCHEMES.register("awq")
class AWQ(Int4):
    """int4 storage; `moe.quant.awq` scales the weights (and folds the inverse into the layer
    before) from calibration activations first."""

    name = "awq"
    searches_scales = True


@QUANT_SCHEMES.register("fp8_weight")
class FP8Weight(Scheme):
    """E4M3 weights, one fp32 scale per output channel; stored as the E4M3 bytes (uint8), so that
    `model.to(dtype)` (which casts every floating-point tensor) cannot touch them."""

    name, bits = "fp8_weight", 8

    def quantize(self, w):
        w = w.float()
        scale = (w.abs().amax(-1, keepdim=True) / FP8_MAX).clamp(min=_EPS)
        return {"qweight": (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(torch.uint8), "scale": scale}

    def dequantize(self, q, in_features, dtype):
        return (q["qweight"].view(FP8_DTYPE).float() * q["scale"]).to(dtype)


@QUANT_SCHEMES.register("fp8")
class FP8(FP8Weight):
    """W8A8: FP8 weights and dynamic per-token FP8 activations. On CPU the matmul itself runs in
    the activations' dtype on the dequantised operands (the same products and sums an FP8 tensor
    core computes, up to accumulation order). On CUDA sm_89+ the quantized modules run it as an FP8 x FP8
tensor-core GEMM instead (kernels/quant_gemm, moe/quant/dispatch.py)."""

    name = "fp8"
    act_fp8 = True


def quantize_activation_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token E4M3 quantization of activations `[..., D]`: `(codes float8_e4m3fn [..., D],
    scales fp32 [...])`, scale = token amax / 448 (what an FP8 tensor-core GEMM consumes)."""
    x32 = x.float()
    scale = (x32.abs().amax(-1, keepdim=True) / FP8_MAX).clamp(min=_EPS)
    return (x32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale.squeeze(-1)


def quantize_activation(x: torch.Tensor) -> torch.Tensor:
    """Dynamic per-token E4M3 quantize-dequantize of activations `[..., D]` (scale = token amax / 448)."""
    q, scale = quantize_activation_fp8(x)
    return (q.float() * scale.unsqueeze(-1)).to(x.dtype)


def get_scheme(name: str, group_size: int = 128) -> Scheme:
    return QUANT_SCHEMES.lookup(name)(group_size)
