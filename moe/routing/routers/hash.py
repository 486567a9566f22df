"""Hash routing: a fixed random map from token id to experts, nothing learned.

Roller et al., "Hash Layers For Large Sparse Models", NeurIPS 2021 (arXiv:2106.04426).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from moe.errors import ConfigError
from moe.routing.routers.base import ROUTERS, Router, RouterConfig, RouterOutput, load_balancing_loss, require

HASH_SEED = 20210608  # fixed: the same token -> experts map in every run, layer and checkpoint
CHUNK = 1024  # table rows are generated in chunks of this many token ids


def hash_table_rows(start_chunk: int, n_chunks: int, n_experts: int, top_k: int) -> torch.Tensor:
    """Rows for token ids [start_chunk * CHUNK, (start_chunk + n_chunks) * CHUNK): k distinct
    experts per id, a random permutation prefix drawn from a generator seeded by
    (HASH_SEED, chunk). A row depends only on its token id, never on how far the table grew."""
    rows = []
    for c in range(start_chunk, start_chunk + n_chunks):
        g = torch.Generator().manual_seed(HASH_SEED + c)
        rows.append(torch.rand(CHUNK, n_experts, generator=g).argsort(dim=-1)[:, :top_k])
    return torch.cat(rows)


@ROUTERS.register("hash")
class HashRouter(Router):
    """Stages: token id -> row of the fixed table `table[V, k]` (k distinct experts) ->
    uniform weights 1/k -> optional capacity (`finish`, training only; eval is dropless).
    The hidden state is ignored.

    No learned router: `learned = False`, and the base gate `weight` is kept only frozen
    (`requires_grad=False`, so the optimizer never sees it) so the state-dict layout and the
    initialisation RNG stream of every other weight are the same as with any other variant.
    Router losses do not apply (nothing to train): `loss` is always 0; the balance loss is
    still reported as a metric. temperature, jitter and renormalize have no effect (and
    group-limited routing is not an option).

    The table is a buffer generated from a fixed seed, grown on demand to cover the largest
    token id seen (the router is not told the vocabulary size); it is saved in checkpoints,
    and loading accepts a table of any length (rows depend only on the token id).
    `probs_TE` is the routing distribution actually used (1/k on the k experts).
    """

    uses_token_ids = True
    learned = False

    @dataclass
    class Config(RouterConfig):
        name: ClassVar[str] = "hash"
        aux_loss_coef: float = 0.0  # no effect: nothing to train (the balance loss is only logged)
        z_loss_coef: float = 0.0  # no effect: there are no router logits

        def check(self, n_experts: int) -> None:
            super().check(n_experts)
            if self.drop_experts:
                raise ConfigError(f"router.drop_experts={list(self.drop_experts)}: hash routing has a fixed token -> "
                                  "experts table and no gate to remove experts from")

    def __init__(self, cfg, d_model: int, n_experts: int):
        super().__init__(cfg, d_model, n_experts)
        self.weight.requires_grad_(False)
        self.register_buffer("table", hash_table_rows(0, 1, n_experts, self.top_k))

    def _ensure_rows(self, max_id: int) -> None:
        have = self.table.shape[0] // CHUNK
        need = max_id // CHUNK + 1
        if need > have:
            more = hash_table_rows(have, need - have, self.n_experts, self.top_k).to(self.table.device)
            self.table = torch.cat([self.table, more])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "table"
        if key in state_dict:  # a table of any (chunk-multiple) length: adopt its size first
            self.table = torch.empty_like(state_dict[key], device=self.table.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x_TD: torch.Tensor, token_ids_T=None, *, need_losses: bool = True) -> RouterOutput:
        if token_ids_T is None:
            raise ValueError("the hash router routes by token id: call router(x_TD, token_ids_T) "
                             "(the MoE layer passes the model's input_ids)")
        ids_T = token_ids_T.reshape(-1).long()
        require(ids_T.numel() == x_TD.shape[0], f"hash router got {ids_T.numel()} token ids for "
                                                f"{x_TD.shape[0]} tokens")
        if ids_T.numel():
            self._ensure_rows(int(ids_T.max()))
        experts_TK = self.table[ids_T].to(x_TD.device)
        weights_TK = torch.full(experts_TK.shape, 1.0 / self.top_k, device=x_TD.device)
        probs_TE = torch.zeros(ids_T.numel(), self.n_experts, device=x_TD.device).scatter_(
            1, experts_TK, 1.0 / self.top_k)
        if not need_losses:
            return self.finish(experts_TK, weights_TK, probs_TE, None, apply_capacity=self.training, need_losses=False)
        aux = load_balancing_loss(probs_TE, experts_TK, self.n_experts)
        out = self.finish(experts_TK, weights_TK, probs_TE, None, aux_loss=aux, apply_capacity=self.training)
        out.loss = probs_TE.new_zeros(())  # nothing learnable: router losses do not apply
        return out
