"""mxfp4: OCP microscaling FP4 weights (the format GPT-OSS publishes its experts in): along the input
dim, every block of 32 values shares one power-of-two scale (an e8m0 exponent, bias 127) and each
value is an e2m1 code (sign, 2-bit exponent, 1-bit mantissa: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}).
Activations stay in full precision. 4.25 bits per weight.

Stored per weight `[..., O, I]` (the layout of GPT-OSS's `*_blocks` / `*_scales` and of
`kernels.mxfp4_gemm`): `blocks` uint8 `[..., O, G, 16]` (two codes a byte, the low nibble first)
and `scales` uint8 `[..., O, G]`, G = ceil(I / 32); a short last block is zero-padded.

Quantization follows the OCP MX spec v1.0 (section 6.3): the shared exponent is
`floor(log2(amax)) - 2` (2 = e2m1's largest exponent), so the largest value of a block lands in
[4, 8) and values above 6 saturate to +-6; each value is rounded to the nearest e2m1 value, ties to
the even mantissa. (triton_kernels' `downcast_to_mxfp`, which OpenAI's tooling uses, rounds the scale
up instead, `2^ceil(log2(amax / 6))`: no saturation, one bit of resolution less for the largest
values. Both are valid MX encodings, and GPT-OSS checkpoints are never re-quantized: their stored
bytes are kept, `moe/hf/families/gpt_oss.py`.) Written here rather than imported: torchao's MX
tensors are 2-D training subclasses, and the rounding is ten lines.

By default only the experts are quantized, as in GPT-OSS (its attention, router, embeddings and LM
head stay bf16); `quant.linear=true` also quantizes the attention projections and dense FFNs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.mxfp4_gemm import BLOCK, dequantize_mxfp4
from moe.quant.schemes.base import QUANT_SCHEMES, Scheme

E2M1_MAX = 6.0
E2M1_EMAX = 2  # the exponent of e2m1's largest normal value (6 = 1.5 * 2^2)
# The non-negative e2m1 values in code order (codes 0..7; the sign is bit 3).
_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def round_to_e2m1(a: torch.Tensor) -> torch.Tensor:
    """|values| (fp32, >= 0) rounded to the nearest e2m1 magnitude, ties to the even mantissa,
    saturating at 6. The spacing is 0.5 below 2, 1 in [2, 4), 2 in [4, 6]; `torch.round` rounds half
    to even, and an even multiple of the spacing is exactly a value with mantissa bit 0."""
    q = torch.where(a < 2, torch.round(a * 2) / 2, torch.where(a < 4, torch.round(a), torch.round(a / 2) * 2))
    return q.clamp(max=E2M1_MAX)


def shared_exponents(amax: torch.Tensor) -> torch.Tensor:
    """The OCP shared exponent of each block: floor(log2(amax)) - 2, within e8m0's [-127, 127];
    all-zero blocks get -127 (any scale encodes zeros)."""
    _, exp = torch.frexp(amax)  # amax = mantissa * 2^exp, mantissa in [0.5, 1): floor(log2) = exp - 1
    shared = exp.to(torch.int32) - 1 - E2M1_EMAX
    return torch.where(amax > 0, shared, -127).clamp(-127, 127)


def quantize_mxfp4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """`w [..., O, I]` -> {"blocks": uint8 [..., O, G, 16], "scales": uint8 [..., O, G]}."""
    *lead, O, I = w.shape
    G = -(-I // BLOCK)
    if w.is_meta:  # a skeleton to load stored tensors into (moe.quant.quantized_skeleton)
        return {"blocks": torch.empty(*lead, O, G, BLOCK // 2, dtype=torch.uint8, device="meta"),
                "scales": torch.empty(*lead, O, G, dtype=torch.uint8, device="meta")}
    w = torch.nn.functional.pad(w.float(), (0, G * BLOCK - I)).reshape(*lead, O, G, BLOCK)
    shared = shared_exponents(w.abs().amax(-1))
    scaled = torch.ldexp(w, -shared.unsqueeze(-1).float())  # exact: a power of two
    mag = round_to_e2m1(scaled.abs())
    table = torch.tensor(_MAGNITUDES, device=w.device)
    codes = torch.searchsorted(table, mag.contiguous()).to(torch.uint8) | (torch.signbit(scaled).to(torch.uint8) << 3)
    codes = codes.flatten(-2)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).reshape(*lead, O, G, BLOCK // 2)
    return {"blocks": blocks, "scales": (shared + 127).to(torch.uint8)}


@QUANT_SCHEMES.register("mxfp4")
class MXFP4(Scheme):
    """OCP MXFP4 weights (module docstring); the Triton kernels are `kernels/mxfp4_gemm`."""

    name, bits, kernel_format = "mxfp4", 4, "mxfp4"

    @dataclass
    class Config:
        linear: bool = False  # also quantize attention projections and dense FFNs (default: experts only)

    @property
    def quantizes_linears(self) -> bool:
        return self.config.linear

    def quantize(self, w):
        return quantize_mxfp4(w)

    def dequantize(self, q, in_features, dtype):
        return dequantize_mxfp4(q["blocks"], q["scales"], in_features, dtype)
