"""`MXWeight`: an MXFP4 weight as the kernels read it (the tensors `moe.quant`'s `mxfp4` scheme stores
and GPT-OSS checkpoints hold, unchanged), checked once when it is built.

For a weight of logical shape `[*lead, O, I]` (lead = `[E]` for expert stacks), quantized along I in
blocks of 32 (the last block zero-padded):

    blocks  uint8 [*lead, O, G, 16]  two e2m1 codes a byte, the low nibble first (G = ceil(I / 32))
    scales  uint8 [*lead, O, G]      an e8m0 exponent per block (bias 127; 255, NaN, is never stored)

    w[..., o, 32 g + i] = e2m1(code i of block g) * 2 ** (scales[..., o, g] - 127)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32  # values per e8m0 scale (the OCP MX block size)


@dataclass(frozen=True)
class MXWeight:
    blocks: torch.Tensor
    scales: torch.Tensor
    in_features: int

    def __post_init__(self):
        b, s = self.blocks, self.scales
        if b.dtype != torch.uint8 or b.dim() not in (3, 4) or b.shape[-1] != BLOCK // 2:
            raise ValueError(f"MXWeight.blocks must be uint8 [(E,) O, G, {BLOCK // 2}]; got {b.dtype} {tuple(b.shape)}")
        if s.dtype != torch.uint8 or s.shape != b.shape[:-1] or s.device != b.device:
            raise ValueError(f"MXWeight.scales must be uint8 {tuple(b.shape[:-1])} on {b.device}; got {s.dtype} "
                             f"{tuple(s.shape)} on {s.device}")
        if not (b.is_contiguous() and s.is_contiguous()):
            raise ValueError("MXWeight: blocks and scales must be contiguous")
        if not 0 < self.in_features <= b.shape[-2] * BLOCK or self.in_features <= (b.shape[-2] - 1) * BLOCK:
            raise ValueError(f"MXWeight.in_features={self.in_features} does not fit {b.shape[-2]} blocks of {BLOCK}")

    @property
    def n_experts(self):
        """E of an expert stack, None for a 2-D weight."""
        return self.blocks.shape[0] if self.blocks.dim() == 4 else None

    @property
    def out_features(self) -> int:
        return self.blocks.shape[-3]
