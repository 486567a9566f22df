"""The PyTorch reference of the MLA decode kernel (`mla_decode_torch`): it defines the semantics
the Triton kernel is tested against and is the engine's MLA decode on the `torch` backend."""

from __future__ import annotations

import torch

from kernels.mla_decode.checks import check_mla_decode
from kernels.paged_attention.reference import gather_cache


def mla_decode_torch(q_latent_THC: torch.Tensor, q_rope_THR: torch.Tensor, cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """[T, H, C]: for each sequence t and head h, softmax_j(scale * (q_latent . c_j + q_rope . k_rope_j))
    over its `context_lens[t]` cached rows `[c_j, k_rope_j]`, times c_j (fp32 softmax and sums)."""
    check_mla_decode(q_latent_THC, q_rope_THR, cache, block_tables, context_lens)
    C = q_latent_THC.shape[-1]
    rows_TLw = gather_cache(cache, block_tables)[:, :, 0].float()
    latent_TLC, k_rope_TLR = rows_TLw[..., :C], rows_TLw[..., C:]
    scores_THL = (torch.matmul(q_latent_THC.float(), latent_TLC.transpose(1, 2))
                  + torch.matmul(q_rope_THR.float(), k_rope_TLR.transpose(1, 2))) * scale
    valid_TL = torch.arange(rows_TLw.shape[1], device=cache.device)[None, :] < context_lens[:, None]
    p_THL = torch.softmax(scores_THL.masked_fill(~valid_TL[:, None, :], float("-inf")), dim=-1)
    return torch.matmul(p_THL, latent_TLC).to(q_latent_THC.dtype)
