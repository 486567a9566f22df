"""The router interface: every variant maps tokens to (experts, weights) the same way.

Each variant owns its options: a dataclass `Config` on the router class, extending `RouterConfig`
(the options every router has) or `GroupLimitedConfig` (plus DeepSeek's group-limited routing),
with the variant's own defaults; `Config.name` is the variant's registered name. The option checks
live there, once (`check`, run by `validate_model` and `build_router`).

A router sees the flattened hidden states `x_TD` (and, for variants that need them, the
token ids) and returns a `RouterOutput`. With `need_losses=False` (the inference path: the
inference engine when nobody reads routing statistics, `Transformer.forward(need_records=False)`)
it returns the same experts, weights and probabilities but computes no losses (`aux_loss`,
`z_loss` and `loss` are None): about a dozen small ops per layer a decode step does not need. It is
refused in training mode, where the losses are what the router learns from. Experts listed in `router.drop_experts` (an
inference-time ablation) are removed: their gate logits are -inf, so their probability is 0, the
softmax runs over the other experts, and selection (`without_dropped`) never picks them. Dropped assignments (over capacity) carry the
sentinel expert id `n_experts` and weight 0, so dispatch code can sort them to the end and
skip them without a second mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

from moe.config import in_range, index_list, positive
from moe.errors import ConfigError
from moe.registry import Registry

ROUTERS: Registry[type["Router"]] = Registry("router.name", package="moe.routing.routers")

# The flat router fields of the configs written before each router owned its options: every saved
# config of an older run has all of them. Reading one keeps the fields of its router and drops the
# others (`resolve_router`): that router ignored them then too.
LEGACY_FIELDS = ("top_k", "renormalize", "aux_loss_coef", "z_loss_coef", "temperature", "jitter", "capacity_factor",
                 "score_func", "bias_update_rate", "seq_aux_loss_coef", "sinkhorn_iters", "n_groups", "topk_groups",
                 "drop_experts")


@dataclass
class RouterConfig:
    """The options every router has (a variant's `Config` extends this, with its own defaults)."""

    name: ClassVar[str] = ""  # the registered name of the variant whose Config this is
    top_k: int = 2
    renormalize: bool = True  # divide the top-k weights by their sum (Mixtral does)
    aux_loss_coef: float = 0.01  # Switch/GShard load balancing: E * sum_i f_i * P_i
    z_loss_coef: float = 0.001  # ST-MoE router z-loss: mean(logsumexp(logits)^2)
    temperature: float = 1.0  # logits are divided by it before the softmax
    jitter: float = 0.0  # multiplicative uniform noise on the router input in training
    capacity_factor: Optional[float] = None  # None = dropless; else per-expert capacity
    # Inference-time ablation: these experts are removed from the router (their gate logits are
    # -inf, so they are never selected and the softmax runs over the others). Not for training.
    drop_experts: list = field(default_factory=list)

    def check(self, n_experts: int) -> None:
        """Raise a ConfigError naming the first bad option (some bounds depend on the model's
        `n_experts`). A variant adds its own checks after `super().check(n_experts)`."""
        positive("router.top_k", self.top_k)
        if self.top_k > n_experts:
            raise ConfigError(f"router.top_k={self.top_k} must be <= model.n_experts={n_experts}")
        index_list("router.drop_experts", self.drop_experts, n_experts, "model.n_experts")
        if self.top_k > n_experts - len(self.drop_experts):
            raise ConfigError(f"router.top_k={self.top_k} must be <= the {n_experts - len(self.drop_experts)} experts "
                              f"left after router.drop_experts={list(self.drop_experts)}")
        positive("router.temperature", self.temperature)
        positive("router.aux_loss_coef", self.aux_loss_coef, allow_zero=True)
        positive("router.z_loss_coef", self.z_loss_coef, allow_zero=True)
        in_range("router.jitter", self.jitter, 0.0, 1.0, "[)")  # noise factors stay in (0, 2)
        if self.capacity_factor is not None:
            positive("router.capacity_factor", self.capacity_factor)

    def check_model(self, model: Any) -> None:
        """`check` against a ModelConfig (how `moe.config.validate_model` asks a variant section)."""
        self.check(model.n_experts)


@dataclass
class GroupLimitedConfig(RouterConfig):
    """A router that can restrict each token to the experts of its best groups (`group_limited_mask`)."""

    n_groups: int = 1  # group-limited routing: experts split in n_groups groups...
    topk_groups: int = 1  # ...and each token may use experts of topk_groups groups
    # A group scores by the sum of its best `group_score_top` experts (1: its best, DeepSeek-V2; 2: V3).
    group_score_top: int = 1

    def check(self, n_experts: int) -> None:
        super().check(n_experts)
        positive("router.n_groups", self.n_groups)
        if n_experts % self.n_groups != 0:
            raise ConfigError(f"model.n_experts={n_experts} must be divisible by router.n_groups={self.n_groups}")
        if not 1 <= self.group_score_top <= n_experts // self.n_groups:
            raise ConfigError(f"router.group_score_top={self.group_score_top} must be in [1, the "
                              f"{n_experts // self.n_groups} experts of a group (model.n_experts / router.n_groups)]")
        if not 1 <= self.topk_groups <= self.n_groups:
            raise ConfigError(f"router.topk_groups={self.topk_groups} must be in [1, router.n_groups={self.n_groups}]")


@dataclass
class RouterOutput:
    experts_TK: torch.Tensor  # int64 expert ids; n_experts marks a dropped assignment
    weights_TK: torch.Tensor  # fp32 combine weights; 0 where dropped
    probs_TE: torch.Tensor  # fp32 router distribution (for entropy metrics and losses)
    # The losses are None on the inference path (`need_losses=False`).
    aux_loss: Optional[torch.Tensor]  # raw load-balancing loss (before its coefficient)
    z_loss: Optional[torch.Tensor]  # raw router z-loss (before its coefficient)
    loss: Optional[torch.Tensor]  # coefficient-weighted sum, added to the LM loss
    n_dropped: torch.Tensor  # number of (token, slot) assignments dropped by capacity
    selected_TK: Optional[torch.Tensor] = None  # choices before capacity dropping


class Router(nn.Module):
    """Base class: a linear gate `[n_experts, d_model]` plus shared helpers."""

    uses_token_ids = False  # hash routing needs the ids, the others do not
    uses_seq_len = False  # routers whose forward takes `seq_len=` (per-sequence losses)
    learned = True

    def __init__(self, cfg: RouterConfig, d_model: int, n_experts: int):
        super().__init__()
        self.cfg = cfg
        self.n_experts = n_experts
        self.top_k = cfg.top_k
        self.dropped = tuple(int(e) for e in cfg.drop_experts)
        self.weight = nn.Parameter(torch.empty(n_experts, d_model))  # same layout as HF's gate
        self.register_parameter("bias", None)  # a gate bias, set by the MoE layer with model.router_bias (GPT-OSS)

    def logits(self, x_TD: torch.Tensor) -> torch.Tensor:
        """Gate logits in fp32, with training-time jitter on the input and the temperature."""
        if self.training and self.cfg.jitter > 0:
            noise = torch.empty_like(x_TD).uniform_(1.0 - self.cfg.jitter, 1.0 + self.cfg.jitter)
            x_TD = x_TD * noise
        logits_TE = F.linear(x_TD, self.weight, self.bias).float()
        if self.cfg.temperature != 1.0:  # (x / 1.0 is x exactly: one op per layer saved at decode)
            logits_TE = logits_TE / self.cfg.temperature
        return self.without_dropped(logits_TE)

    def without_dropped(self, scores_TE: torch.Tensor) -> torch.Tensor:
        """`scores_TE` with -inf at the dropped experts (`router.drop_experts`), so that neither a
        softmax nor a top-k can give them anything."""
        if not self.dropped:
            return scores_TE
        index = torch.tensor(self.dropped, device=scores_TE.device)
        return scores_TE.index_fill(-1, index, float("-inf"))

    def forward(self, x_TD: torch.Tensor, token_ids_T: Optional[torch.Tensor] = None, *,
                need_losses: bool = True) -> RouterOutput:
        raise NotImplementedError

    def after_step(self) -> None:
        """Called by the trainer after each optimizer step; for updates that are not
        gradient descent (aux-loss-free bias balancing). Default: nothing."""

    # ---------------------------------------------------------------- shared helpers
    def finish(self, experts_TK, weights_TK, probs_TE, logits_TE, aux_loss=None, *,
               apply_capacity: bool = True, extra_loss=None, n_dropped=None, need_losses: bool = True) -> RouterOutput:
        """Apply capacity, compute the auxiliary losses and package the output.

        `apply_capacity=False` skips capacity dropping (for routers that balance by
        construction); `extra_loss` (already coefficient-weighted) is added to `loss`;
        `n_dropped` overrides the drop count when capacity is not applied here.
        `need_losses=False`: the inference path, the same routing without the losses."""
        if not need_losses and self.training:
            raise ValueError("need_losses=False (the inference path) with the router in training mode: its "
                             "losses are what it trains on; call model.eval() first")
        selected_TK = experts_TK
        experts_TK, weights_TK, n_dropped = self._capacity(experts_TK, weights_TK, apply_capacity, n_dropped)
        if not need_losses:
            return RouterOutput(experts_TK, weights_TK, probs_TE, None, None, None, n_dropped, selected_TK)
        if aux_loss is None:  # (on the choices before capacity)
            aux_loss = load_balancing_loss(probs_TE, selected_TK, self.n_experts)
        z = z_loss(logits_TE) if logits_TE is not None else probs_TE.new_zeros(())
        loss = self.cfg.aux_loss_coef * aux_loss + self.cfg.z_loss_coef * z
        if extra_loss is not None:
            loss = loss + extra_loss
        return RouterOutput(experts_TK, weights_TK, probs_TE, aux_loss, z, loss, n_dropped, selected_TK)

    def _capacity(self, experts_TK, weights_TK, apply_capacity: bool, n_dropped):
        """(experts, weights, drop count) after capacity dropping when `apply_capacity` and the
        router has a capacity factor; else unchanged, with `n_dropped` (or 0) as the count."""
        if apply_capacity and self.cfg.capacity_factor is not None:
            cap = expert_capacity(experts_TK.numel(), self.n_experts, self.cfg.capacity_factor)
            return drop_over_capacity(experts_TK, weights_TK, self.n_experts, cap)
        if n_dropped is not None:
            return experts_TK, weights_TK, torch.as_tensor(n_dropped, dtype=torch.long, device=experts_TK.device)
        return experts_TK, weights_TK, torch.zeros((), dtype=torch.long, device=experts_TK.device)


def require(ok: bool, message: str) -> None:
    """Raise a ConfigError with `message` unless `ok` (for router-specific option checks)."""
    if not ok:
        raise ConfigError(message)


def load_balancing_loss(probs_TE: torch.Tensor, experts_TK: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Switch/GShard balance loss E * sum_i f_i * P_i.

    f_i is the fraction of the T*K assignments that chose expert i (a count: no gradient),
    P_i the mean router probability of expert i (carries the gradient). With f normalised
    over all T*K assignments the loss is 1.0 for a perfectly uniform router at any top_k.
    """
    counts_E = torch.bincount(experts_TK.reshape(-1), minlength=n_experts)[:n_experts]
    f_E = counts_E.float() / max(experts_TK.numel(), 1)
    P_E = probs_TE.mean(dim=0)
    return n_experts * torch.sum(f_E * P_E)


def z_loss(logits_TE: torch.Tensor) -> torch.Tensor:
    """ST-MoE router z-loss: mean over tokens of logsumexp(logits)^2 (keeps logits small)."""
    return torch.logsumexp(logits_TE, dim=-1).pow(2).mean()


def expert_capacity(n_assignments: int, n_experts: int, capacity_factor: float) -> int:
    """Slots per expert: capacity_factor times an even share of the assignments."""
    return max(1, math.ceil(capacity_factor * n_assignments / n_experts))


def drop_over_capacity(experts_TK: torch.Tensor, weights_TK: torch.Tensor, n_experts: int, capacity: int):
    """Keep at most `capacity` assignments per expert, dropping the rest.

    Priority follows Switch/GShard: every token's first choice comes before any second
    choice, and within a slot earlier tokens come first. Returns the experts with the
    sentinel `n_experts` where dropped, the weights zeroed there, and the drop count.
    """
    T, K = experts_TK.shape
    flat_KT = experts_TK.t().reshape(-1)  # slot-major priority order
    order = torch.argsort(flat_KT, stable=True)
    sorted_e = flat_KT[order]
    counts_E = torch.bincount(sorted_e, minlength=n_experts + 1)
    starts = torch.cumsum(counts_E, 0) - counts_E
    rank_sorted = torch.arange(flat_KT.numel(), device=flat_KT.device) - starts[sorted_e]
    rank_KT = torch.empty_like(rank_sorted)
    rank_KT[order] = rank_sorted
    keep_TK = (rank_KT < capacity).reshape(K, T).t() & (experts_TK < n_experts)
    n_dropped = (~keep_TK & (experts_TK < n_experts)).sum()
    experts_TK = torch.where(keep_TK, experts_TK, torch.full_like(experts_TK, n_experts))
    weights_TK = torch.where(keep_TK, weights_TK, torch.zeros_like(weights_TK))
    return experts_TK, weights_TK, n_dropped


def top_k_choice(select_TE: torch.Tensor, weights_TE: torch.Tensor, k: int, renormalize: bool,
                 eps: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-choice routing shared by the variants: the k best experts by `select_TE` (which
    may carry biases, balancing or -inf group masks), weighted by `weights_TE` at those
    experts, divided by their sum when `renormalize` (the sum clamped at `eps`)."""
    if select_TE is weights_TE:  # (no bias, group mask or dropped expert) top-k's values are the weights
        weights_TK, experts_TK = torch.topk(select_TE, k, dim=-1)
    else:
        experts_TK = torch.topk(select_TE, k, dim=-1).indices
        weights_TK = weights_TE.gather(1, experts_TK)
    if renormalize:
        total_T1 = weights_TK.sum(dim=-1, keepdim=True)
        weights_TK = weights_TK / (total_T1.clamp_min(eps) if eps else total_T1)
    return experts_TK, weights_TK


def group_limited_mask(scores_TE: torch.Tensor, n_groups: int, topk_groups: int, score_top: int = 1) -> torch.Tensor:
    """DeepSeek-style group-limited routing: keep only the experts of each token's best
    `topk_groups` groups (a group scores by its best expert, or by the sum of its best
    `score_top`, DeepSeek-V3); others get -inf."""
    if n_groups <= 1:
        return scores_TE
    T, E = scores_TE.shape
    grouped_TGe = scores_TE.view(T, n_groups, E // n_groups)
    if score_top == 1:
        group_scores_TG = grouped_TGe.amax(dim=-1)
    else:
        group_scores_TG = grouped_TGe.topk(score_top, dim=-1).values.sum(dim=-1)
    top_groups_TG = torch.topk(group_scores_TG, topk_groups, dim=-1).indices
    keep_TG = torch.zeros_like(group_scores_TG, dtype=torch.bool).scatter_(1, top_groups_TG, True)
    keep_TE = keep_TG.repeat_interleave(E // n_groups, dim=1)
    return scores_TE.masked_fill(~keep_TE, float("-inf"))
