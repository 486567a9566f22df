"""Switch router: top-1 with an expert capacity and the Switch balance loss.

Fedus, Zoph & Shazeer, "Switch Transformers: Scaling to Trillion Parameter Models with
Simple and Efficient Sparsity", JMLR 2022 (arXiv:2101.03961).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch

from moe.errors import ConfigError
from moe.routing.routers.base import (ROUTERS, GroupLimitedConfig, Router, RouterOutput, group_limited_mask,
                                     top_k_choice)


@ROUTERS.register("switch")
class SwitchRouter(Router):
    """Stages: gate logits (training jitter, temperature) -> softmax over all experts ->
    (group limit) -> top-1 -> combine weight = the raw probability p_i(x) of the chosen
    expert -> capacity (`capacity_factor`, default 1.25 in `configs/router/switch.yaml`):
    each expert keeps at most ceil(cf * T / E) tokens, in token order, the rest are dropped
    (sentinel id, weight 0: the token only keeps its residual) -> Switch balance loss
    E * sum_i f_i P_i and the z-loss.

    Capacity and jitter apply in training only: eval/inference routes every token to its
    top-1 expert (dropless), since a token's drop depends on the other tokens of the batch
    and token-by-token generation has no such batch. `moe/train_eval_overlap` measures
    the difference.

    Top-1 is the definition of the Switch layer, so `router.top_k` must be 1 (a clear
    ConfigError otherwise, rather than silently routing differently from what the config,
    the active-parameter count and the dense-layer width assume). `renormalize` must be
    false: renormalising one weight makes it 1.0 and cuts the router off from the LM loss.
    """

    @dataclass
    class Config(GroupLimitedConfig):
        name: ClassVar[str] = "switch"
        top_k: int = 1  # the Switch layer is top-1
        renormalize: bool = False  # the combine weight is the raw probability p_i(x)
        jitter: float = 0.01  # Switch's router jitter, 1e-2 (training only)
        capacity_factor: Optional[float] = 1.25  # each expert keeps ceil(1.25 * T / E) tokens in training

        def check(self, n_experts: int) -> None:
            super().check(n_experts)
            if self.top_k != 1:
                raise ConfigError(f"router.top_k={self.top_k}: the switch router is top-1 by definition "
                                  "(Fedus et al. 2021); set router.top_k=1 or use router=topk")
            if self.renormalize:
                raise ConfigError("router.renormalize=true: with top-1 every weight would become 1.0 and the router "
                                  "would get no gradient from the LM loss; the switch router uses the raw "
                                  "probability (set router.renormalize=false)")

    def forward(self, x_TD: torch.Tensor, token_ids_T=None, *, need_losses: bool = True) -> RouterOutput:
        logits_TE = self.logits(x_TD)
        probs_TE = torch.softmax(logits_TE, dim=-1)
        select_TE = self.without_dropped(group_limited_mask(probs_TE, self.cfg.n_groups, self.cfg.topk_groups,
                                                                    self.cfg.group_score_top))
        experts_TK, weights_TK = top_k_choice(select_TE, probs_TE, 1, renormalize=False)
        return self.finish(experts_TK, weights_TK, probs_TE, logits_TE, apply_capacity=self.training,
                           need_losses=need_losses)
