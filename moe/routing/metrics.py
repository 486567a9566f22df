"""Routing metrics: what each MoE forward reports, and how a window of them is reduced.

A layer returns an `MoERecord` of small detached tensors (no host sync in the forward);
the trainer sums records over micro-batches and log steps with `RoutingWindow` and turns
them into scalars with `summarize`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class MoERecord:
    counts_E: torch.Tensor  # assignments each expert processed (after capacity)
    selected_E: torch.Tensor  # assignments each expert was chosen for (before capacity)
    entropy_sum: torch.Tensor  # sum over tokens of the router distribution's entropy (nats)
    n_tokens: int
    n_dropped: torch.Tensor
    aux_loss: torch.Tensor
    z_loss: torch.Tensor


def make_record(out, n_experts: int) -> MoERecord:
    with torch.no_grad():
        probs = out.probs_TE.float()
        ent = entropy(probs)
        counts = torch.bincount(out.experts_TK.reshape(-1), minlength=n_experts + 1)[:n_experts]
        sel = out.selected_TK if out.selected_TK is not None else out.experts_TK
        selected = torch.bincount(sel.reshape(-1), minlength=n_experts + 1)[:n_experts]
        return MoERecord(counts, selected, ent.sum(), probs.shape[0], out.n_dropped.detach(),
                         out.aux_loss.detach(), out.z_loss.detach())


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of a distribution along the last dim (0 log 0 = 0)."""
    p = p.float()
    return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)


class RoutingWindow:
    """Accumulates per-layer records over a logging window (micro-batches and steps)."""

    def __init__(self):
        self.layers: list[Optional[dict]] = []

    def add(self, records: list[MoERecord]) -> None:
        if not self.layers:
            self.layers = [None] * len(records)
        for i, r in enumerate(records):
            cur = self.layers[i]
            vals = dict(counts=r.counts_E.double(), selected=r.selected_E.double(), ent=r.entropy_sum.double(),
                        n=r.n_tokens, dropped=r.n_dropped.double(), aux=r.aux_loss.double(),
                        z=r.z_loss.double(), calls=1)
            if cur is None:
                self.layers[i] = vals
            else:
                for k, v in vals.items():
                    cur[k] = cur[k] + v

    def reset(self) -> None:
        self.layers = []

    def summarize(self) -> tuple[dict, list[list[float]]]:
        """Scalars per layer (`moe/layer{i}/...`) and averaged (`moe/...`), plus the
        layers x experts load matrix (fraction of assignments per expert)."""
        out: dict = {}
        loads: list[list[float]] = []
        per_key: dict[str, list[float]] = {}
        for i, L in enumerate(self.layers):
            if L is None:
                continue
            E = L["counts"].numel()
            total = L["counts"].sum().clamp_min(1)
            load_E = L["counts"] / total
            loads.append(load_E.tolist())
            mean_load = 1.0 / E
            m = {
                "token_entropy": float(L["ent"] / max(L["n"], 1)),
                "token_entropy_norm": float(L["ent"] / max(L["n"], 1)) / math.log(E) if E > 1 else 0.0,
                "load_entropy_norm": float(entropy(load_E)) / math.log(E) if E > 1 else 1.0,
                "load_max": float(load_E.max()),
                "load_min": float(load_E.min()),
                "load_cv": float(load_E.std(unbiased=False) / mean_load),
                "load_imbalance": float(load_E.max() / mean_load),
                "dropped_frac": float(L["dropped"] / L["selected"].sum().clamp_min(1)),
                "dead_experts": int((L["counts"] == 0).sum()),
                "aux_loss": float(L["aux"] / L["calls"]),
                "z_loss": float(L["z"] / L["calls"]),
            }
            for k, v in m.items():
                out[f"moe/layer{i}/{k}"] = v
                per_key.setdefault(k, []).append(v)
        for k, vs in per_key.items():
            out[f"moe/{k}"] = sum(vs) / len(vs)
        return out, loads
