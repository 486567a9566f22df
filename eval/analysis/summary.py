"""From routing records to the sections of results.json (plain, JSON-ready dicts).

Each function applies the statistics of eval/analysis/stats.py to every MoE layer of a
`RoutingRecord` and names what it finds (domains, layers, decoded tokens); the plots and the
Markdown report read these dicts, never the tensors.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from eval.analysis import stats
from eval.analysis.collect import RoutingRecord


def layer_masks(record: RoutingRecord) -> list[torch.Tensor]:
    return [stats.masks_of(e_NK, record.n_experts) for e_NK in record.experts_LNK]


def domain_section(record: RoutingRecord, domains: Sequence[str]) -> dict:
    """Per layer: each domain's fractions over the experts, each expert's domain shares, its
    specialisation score and its most frequent domain."""
    layers = []
    for layer, mask_NE in zip(record.layers, layer_masks(record)):
        frac_DE = stats.domain_fractions(mask_NE, record.domain_N, len(domains))
        score_E, top_E = stats.specialization(frac_DE)
        layers.append({
            "layer": layer,
            "fractions": stats.matrix_or_none(frac_DE),
            "share": stats.matrix_or_none(stats.expert_domain_share(frac_DE)),
            "specialization": [stats.finite_or_none(s) for s in score_E],
            "top_domain": [domains[d] if s == s else None for d, s in zip(top_E.tolist(), score_E.tolist())],
            "mean_specialization": stats.finite_or_none(score_E.nanmean()),
        })
    tokens = torch.bincount(record.domain_N, minlength=len(domains)).tolist()
    return {"domains": list(domains), "tokens": dict(zip(domains, tokens)),
            "uniform": record.top_k / record.n_experts, "chance_specialization": 1 / len(domains), "layers": layers}


def vocabulary_section(record: RoutingRecord, tokenizer, top_tokens: int, top_n: int, min_count: int) -> dict:
    """Per layer and expert: the tokens it receives most often relative to their frequency
    (decoded) and the fraction of its inputs its top-N token ids explain."""
    decoded: dict[int, str] = {}

    def text(i: int) -> str:
        if i not in decoded:
            decoded[i] = tokenizer.decode([i], skip_special_tokens=False) if tokenizer is not None else str(i)
        return decoded[i]

    layers = []
    for layer, mask_NE in zip(record.layers, layer_masks(record)):
        experts = stats.vocabulary(mask_NE, record.token_ids_N, top_tokens, top_n, min_count)
        for e, ex in enumerate(experts):
            ex["expert"] = e
            for t in ex["top_tokens"]:
                t["text"] = text(t["id"])
        layers.append({"layer": layer, "experts": experts})
    return {"top_n": top_n, "min_count": min_count, "uniform_share": record.top_k / record.n_experts,
            "layers": layers}


def coactivation_section(record: RoutingRecord, n_pairs: int = 5) -> dict:
    """Per layer: the joint, conditional and lift matrices and the `n_pairs` pairs with the
    highest lift. With top-k = 1 there is nothing to co-activate: {"skipped": why}."""
    if record.top_k < 2:
        return {"skipped": f"top-k = {record.top_k}: each token has one expert, so no two fire together"}
    layers = []
    for layer, mask_NE in zip(record.layers, layer_masks(record)):
        m = stats.coactivation(mask_NE)
        E = mask_NE.shape[1]
        pairs = [(float(m["lift"][i, j]), i, j) for i in range(E) for j in range(i + 1, E)
                 if m["lift"][i, j] == m["lift"][i, j]]
        top = sorted(pairs, key=lambda p: (-p[0], p[1], p[2]))[:n_pairs]
        layers.append({"layer": layer, **{k: stats.matrix_or_none(v) for k, v in m.items()},
                       "top_pairs": [{"experts": [i, j], "lift": lift, "joint": float(m["joint"][i, j]),
                                      "conditional": [float(m["conditional"][i, j]), float(m["conditional"][j, i])]}
                                     for lift, i, j in top]})
    return {"uniform_lift": stats.uniform_lift(record.top_k, record.n_experts), "layers": layers}


def overlap_by_layer(record: RoutingRecord, reference: RoutingRecord) -> list[dict]:
    """Per layer: the top-k overlap and exact-set agreement of two records of the same tokens."""
    if not torch.equal(record.token_ids_N, reference.token_ids_N):
        raise ValueError("the two routing records are not of the same tokens")
    if record.layers != reference.layers:
        raise ValueError(f"MoE layers {record.layers} and {reference.layers} differ")
    out = []
    for layer, a_NE, b_NE in zip(record.layers, layer_masks(record), layer_masks(reference)):
        o = stats.topk_overlap(a_NE, b_NE)
        out.append({"layer": layer, "overlap": stats.finite_or_none(o["overlap"]),
                    "exact": stats.finite_or_none(o["exact"])})
    return out


def mean_of(values: Sequence[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def generation_section(domains: Sequence[str], engine_loads: Sequence[Sequence[Sequence[float]]],
                       teacher_forced: RoutingRecord, real: RoutingRecord) -> dict:
    """Training-time vs inference-time routing of the same prompts. `engine_loads[d]` is the
    engine's `moe/expert_load` (layers x experts, fraction of assignments) over every token it
    ran for domain d (prompts and generated tokens); `teacher_forced` the one-pass record of the
    same token sequences (prompt + generated tokens but the last, which the engine never ran);
    `real` the record of the domains' text. Per layer: the engine's fraction of each domain's
    tokens per expert (load x k, as in `domain_section`) and its specialisation scores; the
    total variation distance (per domain) between the engine's load and the teacher-forced load
    of the same tokens, and between the load of the generated tokens and of real text."""
    k, D = teacher_forced.top_k, len(domains)
    tf_masks, real_masks = layer_masks(teacher_forced), layer_masks(real)
    layers = []
    for li, layer in enumerate(teacher_forced.layers):
        engine_DE = torch.tensor([engine_loads[d][li] for d in range(D)], dtype=torch.float64) * k
        score_E, _ = stats.specialization(engine_DE)
        tv_engine, tv_generated = [], []
        for d in range(D):
            tf_d = teacher_forced.domain_N == d
            gen_d = tf_d & teacher_forced.generated_N
            tv_engine.append(stats.total_variation(engine_DE[d], stats.load(tf_masks[li][tf_d])))
            real_load = stats.load(real_masks[li][real.domain_N == d])
            tv_generated.append(stats.total_variation(stats.load(tf_masks[li][gen_d]), real_load)
                                if gen_d.any() else None)
        layers.append({
            "layer": layer,
            "engine_fractions": stats.matrix_or_none(engine_DE),
            "teacher_forced_fractions": stats.matrix_or_none(
                stats.domain_fractions(tf_masks[li], teacher_forced.domain_N, D)),
            "generated_fractions": stats.matrix_or_none(stats.domain_fractions(
                tf_masks[li][teacher_forced.generated_N], teacher_forced.domain_N[teacher_forced.generated_N], D)),
            "engine_specialization": [stats.finite_or_none(s) for s in score_E],
            "tv_engine_vs_teacher_forced": dict(zip(domains, tv_engine)),
            "tv_generated_vs_real": dict(zip(domains, tv_generated)),
        })
    all_tv = [v for L in layers for v in L["tv_engine_vs_teacher_forced"].values()]
    return {"domains": list(domains), "layers": layers, "max_tv_engine_vs_teacher_forced": max(all_tv),
            "mean_tv_generated_vs_real": mean_of([v for L in layers for v in L["tv_generated_vs_real"].values()])}
