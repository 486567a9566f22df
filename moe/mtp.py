"""Multi-token prediction (MTP) modules, as DeepSeek-V3 trains them (report, section 2.2).

`model.mtp_depth = D` sequential modules sit after the main model. Module k (1-based) at position
i takes the previous depth's hidden state h^{k-1}_i (h^0: the main model's last block output,
before its final norm) and the embedding of token t_{i+k}, and predicts token t_{i+k+1}:

    h'_i  = W_k [RMSNorm(Emb(t_{i+k})); RMSNorm(h^{k-1}_i)]      (2d -> d, `eh_proj`)
    h^k_i = Block_k(h')                                          (its own attention and FFN)
    p     = softmax(LMHead(RMSNorm_k(h^k_i)))                    (the shared LM head)

The embedding and LM head are the main model's (shared, not copied); each module has its own
norms, projection and transformer block (an MoE block when the model's last block is one, else
dense, built by the model: `make_block`), so this file imports nothing of `moe.model`. The
concatenation order [embedding; hidden] is DeepSeek-V3's released one (`enorm`, `hnorm`,
`eh_proj`), so their MTP weights map onto these modules name for name.

In training the sequence keeps its length T: depth k's inputs are the tokens shifted left by k
(the last k positions padded with token 0) and its targets shifted left by k (padded with -100),
so the padded positions carry no loss; causal attention keeps them from reaching the real ones.
`MultiTokenPrediction.forward` returns each depth's mean cross-entropy, top-1 accuracy and the
routers' losses of its MoE blocks; the trainer adds `lambda / D * sum_k CE_k` to the main loss.
The engine drafts with the same modules (`moe/engine/speculative/mtp.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from moe.loss import IGNORE_INDEX, linear_cross_entropy


class MTPModule(nn.Module):
    """One depth: norms of the two inputs, their projection, one transformer block, a final norm."""

    def __init__(self, block: nn.Module, make_norm: Callable[[], nn.Module], d_model: int):
        super().__init__()
        self.enorm, self.hnorm = make_norm(), make_norm()
        self.eh_proj = nn.Linear(2 * d_model, d_model, bias=False)
        self.block = block
        self.norm = make_norm()  # before the shared LM head (DeepSeek-V3's shared_head.norm)

    def forward(self, h_BTD: torch.Tensor, emb_BTD: torch.Tensor, cos, sin, token_ids_BT: Optional[torch.Tensor],
                kv_context=None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(this depth's hidden state h^k before its final norm, the block's router loss or None)."""
        x_BTD = self.eh_proj(torch.cat([self.enorm(emb_BTD), self.hnorm(h_BTD)], dim=-1))
        x_BTD, aux, _record = self.block(x_BTD, cos, sin, token_ids_BT, kv_context)
        return x_BTD, aux


@dataclass
class MTPOutput:
    losses: list[torch.Tensor] = field(default_factory=list)  # per depth: mean cross-entropy (with grad)
    accuracies: list[torch.Tensor] = field(default_factory=list)  # per depth: top-1 accuracy (detached)
    aux_loss: Optional[torch.Tensor] = None  # the MTP blocks' router losses, summed


def shift_left(x_BT: torch.Tensor, k: int, fill: int) -> torch.Tensor:
    """x shifted k positions to the left along T, the last k positions `fill`."""
    B, T = x_BT.shape
    k = min(k, T)
    return torch.cat([x_BT[:, k:], x_BT.new_full((B, k), fill)], dim=1)


@torch.no_grad()
def top1_accuracy(h_ND: torch.Tensor, w_VD: torch.Tensor, targets_N: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Share of the valid targets that are the argmax of `h_ND @ w_VD.T`, in token chunks (never
    the whole [N, V] logits); 0 when no target is valid."""
    valid_N = targets_N != IGNORE_INDEX
    hits = torch.zeros((), dtype=torch.float32, device=h_ND.device)
    for s in range(0, h_ND.shape[0], chunk):
        pred = (h_ND[s:s + chunk] @ w_VD.to(h_ND.dtype).T).argmax(dim=-1)
        hits += ((pred == targets_N[s:s + chunk]) & valid_N[s:s + chunk]).sum()
    return hits / valid_N.sum().clamp_min(1)


class MultiTokenPrediction(nn.Module):
    """The D modules (`layers`) and their training losses (`forward`)."""

    def __init__(self, depth: int, d_model: int, make_block: Callable[[int], nn.Module],
                 make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.layers = nn.ModuleList(MTPModule(make_block(k), make_norm, d_model) for k in range(depth))

    @property
    def depth(self) -> int:
        return len(self.layers)

    def forward(self, h0_BTD: torch.Tensor, input_ids_BT: torch.Tensor, targets_BT: torch.Tensor, embed: nn.Module,
                lm_head: nn.Linear, cos, sin, fused: bool) -> MTPOutput:
        """Each depth's loss against the targets shifted by its depth (`targets_BT[:, i]` is
        t_{i+1}); `fused`: the LM head fused into the cross-entropy (moe/loss.py), as the main loss."""
        out, h_BTD = MTPOutput(), h0_BTD
        for k, module in enumerate(self.layers, start=1):
            ids_BT = shift_left(input_ids_BT, k, 0)  # t_{i+k}
            tgt_N = shift_left(targets_BT, k, IGNORE_INDEX).reshape(-1)  # t_{i+k+1}
            h_BTD, aux = module(h_BTD, embed(ids_BT), cos, sin, ids_BT)
            hn_ND = module.norm(h_BTD).reshape(-1, h_BTD.shape[-1])
            if fused:
                loss = linear_cross_entropy(hn_ND, lm_head.weight, tgt_N)
            else:
                logits_NV = lm_head(hn_ND)  # fp32 math for bf16; fp64 stays fp64 (the gradient checks)
                loss = F.cross_entropy(logits_NV.to(torch.promote_types(logits_NV.dtype, torch.float32)), tgt_N,
                                       ignore_index=IGNORE_INDEX)
            out.losses.append(loss)
            out.accuracies.append(top1_accuracy(hn_ND.detach(), lm_head.weight.detach(), tgt_N))
            if aux is not None:
                out.aux_loss = aux if out.aux_loss is None else out.aux_loss + aux
        return out
