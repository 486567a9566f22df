"""Auxiliary-loss-free load balancing (DeepSeek-V3): a per-expert bias steers selection.

Wang et al., "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts",
arXiv:2408.15664 (2024); DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437
(2024), section 2.1.2 (bias update, eq. 16) and the complementary sequence-wise loss
(eqs. 17-20).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch

from moe.config import choice, positive
from moe.routing.routers.base import (ROUTERS, GroupLimitedConfig, Router, RouterOutput, group_limited_mask, require,
                                     top_k_choice)

# Floor of a token's sum of sigmoid scores when dividing by it: the scores underflow to exactly 0
# for logits below ~-104 in fp32, and 0 / 0 would be NaN.
SCORE_SUM_EPS = 1e-20


def sequence_balance_loss(probs_TE: torch.Tensor, experts_TK: torch.Tensor, n_experts: int,
                          seq_len: Optional[int] = None) -> torch.Tensor:
    """DeepSeek-V3's sequence-wise balance loss, averaged over sequences.

    Per sequence of S tokens: f_i = E / (K S) * #{tokens that selected i} (no gradient),
    P_i = mean over the sequence of the normalised affinity s'_i, loss = sum_i f_i P_i
    (1.0 when balanced). `seq_len=None` treats the whole flattened batch as one sequence.
    Sentinel ids (dropped assignments) are not counted.
    """
    T, K = experts_TK.shape
    if T == 0:  # an empty batch (no sequences): nothing to balance, and S would be 0
        return probs_TE.new_zeros(())
    E = n_experts
    S = seq_len or T
    require(T % S == 0, f"{T} routed tokens are not a whole number of sequences of length {S}")
    B = T // S
    counts_BE = torch.zeros(B, E + 1, device=probs_TE.device, dtype=probs_TE.dtype)
    counts_BE.scatter_add_(1, experts_TK.reshape(B, S * K), torch.ones_like(counts_BE[:, :1]).expand(B, S * K))
    f_BE = counts_BE[:, :E] * (E / (K * S))
    P_BE = probs_TE.reshape(B, S, E).mean(dim=1)
    return (f_BE * P_BE).sum(dim=-1).mean()


@ROUTERS.register("aux_free")
class AuxFreeRouter(Router):
    """Stages: gate logits (training jitter, temperature) -> affinities s = sigmoid(logits)
    (`score_func`; DeepSeek-V3 uses sigmoid) -> biased scores s + b, used for SELECTION
    ONLY -> (group limit on the biased scores; the base helper scores a group by its best
    expert, where V3 sums its top two) -> top-k -> combine weights = the UNBIASED s of the
    k chosen experts, divided by their sum when `renormalize` -> losses (the batch-level
    Switch loss with `aux_loss_coef`, default 0; DeepSeek-V3's sequence-wise loss with
    `seq_aux_loss_coef`) and optional capacity (training only; eval/inference is dropless).

    Balancing without a loss: every training forward (train mode with autograd on, so
    evaluation, `torch.no_grad()` probes and inference never count) adds the per-expert
    selection counts to `load_counts`; `after_step()`, called by the trainer after each
    optimizer step, applies b_i += bias_update_rate * sign(mean_load - load_i) and resets
    the counts. Over-loaded experts become less attractive, under-loaded ones more, with no
    gradient interfering with the LM loss.

    `e_score_correction_bias` (the name HF's DeepSeek-V3 uses) is a persistent buffer: saved
    in checkpoints, not a Parameter, never touched by the optimizer. `load_counts` is not
    persistent (it is always zero when the trainer checkpoints, right after a step).

    Sequence-wise loss: the MoE layer passes flattened tokens, so the sequence structure
    comes from the optional `seq_len=` argument (`uses_seq_len = True`); without it the
    whole batch counts as one sequence (a batch-wise balance loss).
    """

    uses_seq_len = True

    @dataclass
    class Config(GroupLimitedConfig):
        name: ClassVar[str] = "aux_free"
        aux_loss_coef: float = 0.0  # no Switch balance loss: the bias does the balancing
        score_func: str = "sigmoid"  # sigmoid (DeepSeek-V3) | softmax
        # gamma: b_i += gamma * sign(mean_load - load_i) after each step; 0.01 balances the README sweep
        # (150 steps) within ~50 steps, DeepSeek-V3's 0.001 suits runs of thousands (docs/sweep/aux_free.md)
        bias_update_rate: float = 0.01
        seq_aux_loss_coef: float = 0.0  # DeepSeek-V3's sequence-wise balance loss alpha (V3: 1e-4); 0 = off

        def check(self, n_experts: int) -> None:
            super().check(n_experts)
            choice("router.score_func", self.score_func, ["softmax", "sigmoid"])
            positive("router.bias_update_rate", self.bias_update_rate, allow_zero=True)
            positive("router.seq_aux_loss_coef", self.seq_aux_loss_coef, allow_zero=True)

    def __init__(self, cfg, d_model: int, n_experts: int):
        super().__init__(cfg, d_model, n_experts)
        self.register_buffer("e_score_correction_bias", torch.zeros(n_experts, dtype=torch.float32))
        self.register_buffer("load_counts", torch.zeros(n_experts, dtype=torch.float32), persistent=False)

    def forward(self, x_TD: torch.Tensor, token_ids_T=None, seq_len: Optional[int] = None, *,
                need_losses: bool = True) -> RouterOutput:
        logits_TE = self.logits(x_TD)
        # Expert affinities: independent scores in (0, 1) (sigmoid, DeepSeek-V3) or a distribution.
        scores_TE = torch.sigmoid(logits_TE) if self.cfg.score_func == "sigmoid" else torch.softmax(logits_TE, dim=-1)
        biased_TE = scores_TE.detach() + self.e_score_correction_bias.float()
        select_TE = self.without_dropped(group_limited_mask(biased_TE, self.cfg.n_groups, self.cfg.topk_groups,
                                                                     self.cfg.group_score_top))
        experts_TK, weights_TK = top_k_choice(select_TE, scores_TE, self.top_k, self.cfg.renormalize,
                                              eps=SCORE_SUM_EPS)
        # Normalised affinities s' (a distribution over experts) for metrics and losses; the sum is
        # clamped like the combine weights', so a token whose sigmoid scores all underflow to 0
        # gets zeros instead of 0 / 0 = NaN in every balance loss and metric.
        if self.cfg.score_func == "sigmoid":
            probs_TE = scores_TE / scores_TE.sum(dim=-1, keepdim=True).clamp_min(SCORE_SUM_EPS)
        else:
            probs_TE = scores_TE
        if self.training and torch.is_grad_enabled():
            with torch.no_grad():
                self.load_counts += torch.bincount(experts_TK.reshape(-1), minlength=self.n_experts).float()
        extra = None
        if need_losses and self.cfg.seq_aux_loss_coef > 0:
            extra = self.cfg.seq_aux_loss_coef * sequence_balance_loss(probs_TE, experts_TK, self.n_experts, seq_len)
        return self.finish(experts_TK, weights_TK, probs_TE, logits_TE, apply_capacity=self.training,
                           extra_loss=extra, need_losses=need_losses)

    @torch.no_grad()
    def after_step(self) -> None:
        """b_i += rate * sign(mean_load - load_i) over the loads counted since the last
        step, then reset the counts (no training forward since then: no change)."""
        counts_E = self.load_counts
        self.e_score_correction_bias += self.cfg.bias_update_rate * torch.sign(counts_E.mean() - counts_E)
        counts_E.zero_()
