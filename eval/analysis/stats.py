"""The expert-specialisation statistics, as plain functions of routing tensors.

Every function takes what one MoE layer's router chose for N tokens, either as `experts_NK`
(int expert ids, the router's `experts_TK`; the id `n_experts` marks a dropped slot and is
ignored) or as the selection mask `mask_NE` (bool: expert e is among token n's choices) that
`selection_mask` makes from it. Nothing here needs a model, so each statistic is checked on
hand-made routing tensors with known answers (tests/eval/analysis/test_stats.py).

The definitions follow the OLMoE paper (Muennighoff et al. 2024, section 5), generalised where
noted:
  * domain fraction: the fraction of a domain's tokens routed to each expert (uniform: k/E);
  * domain specialisation of expert e for domain d: the share of e's tokens that come from d,
    with every domain weighted equally (OLMoE counts raw tokens, which is the same when the
    domains are equally large; weighting by rate keeps a small domain from looking "avoided");
    1.0 = the expert sees one domain only, 1/D = no preference;
  * vocabulary specialisation of expert e for token v: the fraction of v's occurrences routed
    to e (uniform: k/E);
  * co-activation: P(j chosen | i chosen) (OLMoE's), and the lift P(i, j) / (P(i) P(j)), which
    is 1 when the two choices are independent;
  * top-k overlap of two routings: per token |A & B| / min(|A|, |B|) (OLMoE's router saturation
    when both choose k experts; with a top-k-reduced model, 1.0 means its choices are a subset).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from moe.routing.probe import selection_mask


def masks_of(experts_NK: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Bool [N, E]: which experts each token was routed to (dropped slots left out)."""
    return selection_mask(experts_NK.long(), n_experts)


# ---------------------------------------------------------------------------- domains

def domain_fractions(mask_NE: torch.Tensor, domain_N: torch.Tensor, n_domains: int) -> torch.Tensor:
    """Float64 [D, E]: fraction of domain d's tokens routed to expert e. A row sums to the
    number of experts per token (k without drops); a domain without tokens is a row of zeros."""
    E = mask_NE.shape[1]
    hits_DE = torch.zeros(n_domains, E, dtype=torch.float64).index_add_(0, domain_N.long(), mask_NE.double())
    tokens_D = torch.bincount(domain_N.long(), minlength=n_domains).double()
    return hits_DE / tokens_D.clamp_min(1).unsqueeze(1)


def expert_domain_share(fractions_DE: torch.Tensor) -> torch.Tensor:
    """Float64 [E, D]: the share of expert e's tokens that come from domain d, every domain
    weighted equally (rows sum to 1; NaN for an expert no domain uses)."""
    total_E = fractions_DE.sum(0)
    share_ED = fractions_DE.T / total_E.unsqueeze(1)
    share_ED[total_E == 0] = float("nan")
    return share_ED


def specialization(fractions_DE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(score_E, domain_E): each expert's largest domain share and that domain's index.
    1.0: the expert receives one domain's tokens only; 1/D: all domains alike; NaN: unused."""
    share_ED = expert_domain_share(fractions_DE)
    score_E, domain_E = share_ED.nan_to_num(-1.0).max(dim=1)
    score_E = torch.where(share_ED.isnan().all(1), torch.full_like(score_E, float("nan")), score_E)
    return score_E, domain_E


# ---------------------------------------------------------------------------- vocabulary

def vocabulary(mask_NE: torch.Tensor, token_ids_N: torch.Tensor, top_tokens: int, top_n: int,
               min_count: int) -> list[dict]:
    """Per expert: `tokens` (how many tokens it received), `top_n_fraction` (the fraction of
    them whose id is one of its `top_n` most frequent ids) and `top_tokens` (up to
    `top_tokens` ids it receives most often relative to their frequency: the fraction `share`
    of the id's occurrences routed to it, among ids seen at least `min_count` times; ties by
    count, then id). Each top token: {"id", "count" (routed to the expert), "freq", "share"}."""
    ids_V, inverse_N = torch.unique(token_ids_N.long(), return_inverse=True)
    freq_V = torch.bincount(inverse_N, minlength=len(ids_V)).double()
    counts_EV = torch.zeros(mask_NE.shape[1], len(ids_V), dtype=torch.float64)
    counts_EV.index_add_(1, inverse_N, mask_NE.T.double())
    share_EV = counts_EV / freq_V
    eligible_V = (freq_V >= min_count).numpy()
    out = []
    for e in range(counts_EV.shape[0]):
        total = float(counts_EV[e].sum())
        n = min(top_n, len(ids_V))
        top_n_fraction = float(counts_EV[e].topk(n).values.sum()) / total if total > 0 else None
        count_V, share_V = counts_EV[e].numpy(), share_EV[e].numpy()
        # np.lexsort sorts by the last key first: share desc, then count desc, then id asc.
        order = np.lexsort((ids_V.numpy(), -count_V, -share_V))
        ranked = [int(v) for v in order if eligible_V[v] and count_V[v] > 0][:top_tokens]
        out.append({"tokens": int(total), "top_n_fraction": top_n_fraction,
                    "top_tokens": [{"id": int(ids_V[v]), "count": int(count_V[v]), "freq": int(freq_V[v]),
                                    "share": float(share_V[v])} for v in ranked]})
    return out


# ---------------------------------------------------------------------------- co-activation

def coactivation(mask_NE: torch.Tensor) -> dict[str, torch.Tensor]:
    """Float64 [E, E] matrices over N tokens: `joint` P(i and j chosen), `conditional`
    P(j chosen | i chosen) (row i; OLMoE's co-activation) and `lift` P(i, j) / (P(i) P(j))
    (1 = independent, 0 = never together). The diagonal (an expert with itself) and rows or
    columns of unused experts are NaN in `conditional` and `lift`; `joint`'s diagonal is P(i)."""
    m = mask_NE.double()
    N = max(m.shape[0], 1)
    joint_EE = (m.T @ m) / N
    p_E = joint_EE.diagonal().clone()
    nan = float("nan")
    conditional = joint_EE / p_E.unsqueeze(1)
    lift = joint_EE / (p_E.unsqueeze(1) * p_E.unsqueeze(0))
    unused = p_E == 0
    for mat in (conditional, lift):
        mat[unused, :] = nan
        mat[:, unused] = nan
        mat.fill_diagonal_(nan)
    return {"joint": joint_EE, "conditional": conditional, "lift": lift}


def uniform_lift(top_k: int, n_experts: int) -> float:
    """The lift of a router that picks k distinct experts uniformly at random: (k-1)E / (k(E-1)),
    below 1 because an expert cannot be chosen twice for one token."""
    return (top_k - 1) * n_experts / (top_k * (n_experts - 1)) if n_experts > 1 and top_k > 0 else float("nan")


# ---------------------------------------------------------------------------- agreement

def topk_overlap(mask_a_NE: torch.Tensor, mask_b_NE: torch.Tensor) -> dict[str, float]:
    """How far two routings of the same N tokens agree: `overlap`, the mean over tokens of
    |A & B| / min(|A|, |B|), and `exact`, the fraction of tokens with the same expert set.
    Tokens where either set is empty (every slot dropped) are left out."""
    if mask_a_NE.shape != mask_b_NE.shape:
        raise ValueError(f"routings of shapes {tuple(mask_a_NE.shape)} and {tuple(mask_b_NE.shape)} cannot be "
                         "compared (not the same tokens, or not the same number of experts)")
    size_a, size_b = mask_a_NE.sum(1), mask_b_NE.sum(1)
    keep_N = (size_a > 0) & (size_b > 0)
    inter_N = (mask_a_NE & mask_b_NE).sum(1)
    ratio_N = inter_N[keep_N].double() / torch.minimum(size_a, size_b)[keep_N].double()
    same_N = (mask_a_NE == mask_b_NE).all(1)[keep_N]
    n = int(keep_N.sum())
    return {"overlap": float(ratio_N.mean()) if n else float("nan"),
            "exact": float(same_N.double().mean()) if n else float("nan"), "tokens": n}


def load(mask_NE: torch.Tensor) -> torch.Tensor:
    """Float64 [E]: fraction of all assignments that go to each expert (sums to 1), the
    engine's `moe/expert_load` row."""
    counts_E = mask_NE.double().sum(0)
    return counts_E / counts_E.sum().clamp_min(1)


def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    """Total variation distance between two load vectors, each normalised to sum to 1:
    0 = identical, 1 = disjoint."""
    p, q = torch.as_tensor(p, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64)
    return 0.5 * float((p / p.sum().clamp_min(1e-300) - q / q.sum().clamp_min(1e-300)).abs().sum())


def finite_or_none(x) -> Optional[float]:
    """A float for results.json (which allows no NaN): None where undefined."""
    x = float(x)
    return x if math.isfinite(x) else None


def matrix_or_none(m: torch.Tensor) -> list:
    """A nested list of `finite_or_none` values."""
    return [[finite_or_none(v) for v in row] for row in m.tolist()]
