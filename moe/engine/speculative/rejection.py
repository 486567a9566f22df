"""Verification of proposed tokens against the target model's logits.

Row j of the target logits (the position before proposal j) gives the target distribution p_j,
processed exactly as the sampler processes a request's logits (repetition penalty over the
context up to that position -> temperature -> top-k -> top-p -> min-p). Greedy requests accept
a proposal iff it is the argmax of p_j. Sampled requests use standard speculative rejection
sampling (Leviathan et al. 2023; Chen et al. 2023): proposal x drawn from q_j is accepted with
probability min(1, p_j(x) / q_j(x)); on the first rejection the token is drawn from the residual
norm(max(p_j - q_j, 0)), and when every proposal is accepted and a row is left, one more token is
drawn from that row's p. The emitted tokens are then distributed exactly as tokens sampled one
at a time from the target. A deterministic proposer (n-gram lookup) has q_j = one-hot(x).
"""

from __future__ import annotations

from typing import Optional

import torch

from moe.engine.sampling.sampler import SamplingParams, apply_repetition_penalty, row_argmax, top_k_top_p_min_p_mask


def target_probs(logits_RV: torch.Tensor, params: SamplingParams, contexts: list) -> torch.Tensor:
    """The distributions the sampler would draw from, one row per logits row (`contexts[r]`: the
    tokens row r's repetition penalty looks at). Greedy: one-hot of the penalised argmax."""
    logits = logits_RV.float()
    R, V = logits.shape
    if params.repetition_penalty != 1.0:
        logits = apply_repetition_penalty(logits, contexts, [params.repetition_penalty] * R)
    if params.greedy:
        # (row_argmax: the sampler's argmax, the same index as `argmax` for ties and NaNs, cheaper on the CPU)
        return torch.zeros_like(logits).scatter_(1, row_argmax(logits).unsqueeze(1), 1.0)
    scaled = logits / params.temperature
    if params.top_k_active or params.top_p < 1 or params.min_p > 0:
        dev = logits.device
        scaled = top_k_top_p_min_p_mask(scaled, torch.full((R,), params.top_k, device=dev),
                                        torch.full((R,), params.top_p, device=dev, dtype=torch.float32),
                                        torch.full((R,), params.min_p, device=dev, dtype=torch.float32))
    return torch.softmax(scaled, dim=-1)


def draw(probs_V: torch.Tensor, generator: Optional[torch.Generator]) -> int:
    """One token from `probs_V` (the sampler's exponential race: argmax(p / E), E ~ Exp(1))."""
    noise = torch.empty_like(probs_V).exponential_(generator=generator)
    return int((probs_V / noise).argmax())


def verify(p_RV: torch.Tensor, drafts: list[int], q_KV: Optional[torch.Tensor], greedy: bool,
           generator: Optional[torch.Generator]) -> tuple[list[int], int, int]:
    """Accept a prefix of `drafts` under the target distributions `p_RV` (R rows: row j is the
    distribution of the token at draft position j; R <= len(drafts) + 1). Returns (the tokens to
    emit: accepted drafts plus, unless every row verified a draft, one token drawn from the target
    or the residual; the number of rows used; the number of drafts accepted)."""
    out: list[int] = []
    R = p_RV.shape[0]
    for j in range(R):
        p = p_RV[j]
        if j == len(drafts):  # every proposal accepted and a row is left: a token of the target's own
            out.append(int(p.argmax()) if greedy else draw(p, generator))
            return out, j + 1, j
        x = drafts[j]
        if greedy:
            ok = int(p.argmax()) == x
        else:
            qx = 1.0 if q_KV is None else float(q_KV[j, x])
            u = torch.rand((), generator=generator, device=p.device).item()
            ok = qx > 0 and u < min(1.0, float(p[x]) / qx)
        if ok:
            out.append(x)
            continue
        if greedy:
            out.append(int(p.argmax()))
        else:
            if q_KV is None:
                residual = p.clone()
                residual[x] = 0.0
            else:
                residual = (p - q_KV[j].to(p.dtype)).clamp_min(0.0)
            total = float(residual.sum())
            # total == 0 only when p == q up to rounding: then p itself is the right distribution
            out.append(draw(residual / total if total > 0 else p, generator))
        return out, j + 1, j
    return out, R, R  # every row verified a proposal (the chunk stopped before the last one)
