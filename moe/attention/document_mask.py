"""The document mask of packed sequences: block-diagonal causal attention from segment ids.

A packed training row holds several documents (conversations) back to back; `segments_BT[b, t]`
names the document of token t. Query t may attend key s when s <= t and both are in the same
document. The mask is built once per forward (`Transformer.forward`) and handed to the backend:
`eager` fills the masked scores with -inf, `sdpa` takes it as its boolean `attn_mask` (True =
attend). Every token attends at least to itself, so no softmax row is empty.
"""

from __future__ import annotations

import torch

from moe.errors import ConfigError


def document_causal_mask(segments_BT: torch.Tensor) -> torch.Tensor:
    """Boolean [B, 1, T, T] mask (broadcast over heads): True where query t may attend key s."""
    if segments_BT.dim() != 2:
        raise ConfigError(f"segment ids must be [batch, seq]; got shape {tuple(segments_BT.shape)}")
    T = segments_BT.shape[1]
    same_BTT = segments_BT[:, :, None] == segments_BT[:, None, :]
    causal_TT = torch.ones(T, T, dtype=torch.bool, device=segments_BT.device).tril()
    return (same_BTT & causal_TT).unsqueeze(1)
