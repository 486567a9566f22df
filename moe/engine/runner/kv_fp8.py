"""The FP8 (E4M3) KV cache (`kv_cache_dtype="fp8_e4m3"`).

Storage, per layer: K and V as E4M3 codes `[num_blocks, block_size, G, d]` plus one fp32 scale
per (token, kv head) `[num_blocks, block_size, G]`: each head vector written is scaled by its own
amax / 448 (dynamic per-head scaling; no calibration pass, never saturates). The scale costs
4 bytes per head per token against d bytes of codes, so a bf16 cache shrinks by
2d / (d + 4): 1.94x at d = 128, 1.78x at d = 32. Per-layer calibrated scales (which would
drop the scale tensor) are not implemented.

Attention reads: the blocks a step's block tables name are dequantised into a compact cache in
the compute dtype and the tables renumbered into it, then the configured paged backend runs
unchanged on that compact cache (so `torch` and `triton` both work; the Triton kernels do not
read E4M3 themselves, which would be the bandwidth-saving GPU path: left out). The work is
proportional to the blocks in use this step, as the `torch` backend's own gather is.

A latent cache (MLA, `n_tensors=1`) keeps one row per token, read as both K and V: one set of
codes and scales, and `compact` returns the same tensor twice.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)


def fp8_bytes_per_block(n_layers: int, block_size: int, n_kv_heads: int, head_dim: int, n_tensors: int = 2) -> int:
    """K and V codes (1 byte each; a latent cache: one tensor) plus one fp32 scale per token and
    head, for every layer."""
    return n_tensors * n_layers * block_size * n_kv_heads * (head_dim + 4)


class FP8KVCache:
    def __init__(self, n_layers: int, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                 device: torch.device, n_tensors: int = 2):
        # E4M3 bytes held as uint8: CPU kernels such as index_copy_ have no float8 version.
        self.codes = torch.zeros(n_layers, n_tensors, num_blocks, block_size, n_kv_heads, head_dim, dtype=torch.uint8,
                                 device=device)
        self.scales = torch.zeros(n_layers, n_tensors, num_blocks, block_size, n_kv_heads, dtype=torch.float32,
                                  device=device)

    def write(self, layer: int, k_NGd: torch.Tensor, v_NGd: torch.Tensor | None, slot_mapping: torch.Tensor) -> None:
        """`v_NGd` None: a latent cache (one tensor)."""
        slots = slot_mapping.long()
        keep = slots >= 0
        rows = [k_NGd] if v_NGd is None else [k_NGd, v_NGd]
        if not bool(keep.all()):
            rows, slots = [x[keep] for x in rows], slots[keep]
        for i, x in enumerate(rows):
            x32 = x.float()
            scale = (x32.abs().amax(-1) / FP8_MAX).clamp(min=1e-12)  # [N, G]
            codes = (x32 / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(torch.uint8)
            G, d = codes.shape[1], codes.shape[2]
            self.codes[layer, i].view(-1, G, d).index_copy_(0, slots, codes)
            self.scales[layer, i].view(-1, G).index_copy_(0, slots, scale)

    def compact(self, layer: int, tables: list[torch.Tensor], dtype: torch.dtype):
        """(k_cache, v_cache) holding only the blocks `tables` name, dequantised to `dtype`,
        and the tables renumbered into them."""
        used = torch.unique(torch.cat([t.reshape(-1) for t in tables]).long()) if tables else \
            torch.zeros(1, dtype=torch.long, device=self.codes.device)
        if used.numel() == 0:
            used = torch.zeros(1, dtype=torch.long, device=self.codes.device)
        remap = torch.zeros(self.codes.shape[2], dtype=torch.int32, device=used.device)
        remap[used] = torch.arange(used.numel(), dtype=torch.int32, device=used.device)
        kv = [(self.codes[layer, i, used].view(FP8).float() * self.scales[layer, i, used].unsqueeze(-1)).to(dtype)
              for i in range(self.codes.shape[1])]
        return kv[0], kv[-1], [remap[t.long()] for t in tables]  # (a latent cache: one tensor, as K and V)

    def dequantized(self, layer: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole cache of `layer`, dequantised (for tests and inspection)."""
        return tuple((self.codes[layer, i].view(FP8).float() * self.scales[layer, i].unsqueeze(-1)).to(dtype)
                     for i in (0, self.codes.shape[1] - 1))
