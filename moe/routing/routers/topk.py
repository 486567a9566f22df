"""Softmax top-k router (Mixtral, Switch/GShard balance loss): the default variant."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from moe.routing.routers.base import (ROUTERS, GroupLimitedConfig, Router, RouterOutput, group_limited_mask,
                                     top_k_choice)


@ROUTERS.register("topk")
class TopKRouter(Router):
    """Stages: gate logits -> softmax over all experts -> (group limit) -> top-k ->
    optional renormalisation of the k weights -> losses and capacity (in `finish`)."""

    @dataclass
    class Config(GroupLimitedConfig):
        name: ClassVar[str] = "topk"

    def forward(self, x_TD: torch.Tensor, token_ids_T=None, *, need_losses: bool = True) -> RouterOutput:
        logits_TE = self.logits(x_TD)
        probs_TE = torch.softmax(logits_TE, dim=-1)
        select_TE = self.without_dropped(group_limited_mask(probs_TE, self.cfg.n_groups, self.cfg.topk_groups,
                                                                    self.cfg.group_score_top))
        experts_TK, weights_TK = top_k_choice(select_TE, probs_TE, self.top_k, self.cfg.renormalize)
        # Capacity only in training: at inference dropping would make a token's output depend
        # on the rest of the batch (and break incremental decoding).
        return self.finish(experts_TK, weights_TK, probs_TE, logits_TE, apply_capacity=self.training,
                           need_losses=need_losses)
