"""Hand-made routing records for the analysis tests: known answers, no model."""

from __future__ import annotations

import itertools

import pytest
import torch

from eval.analysis.collect import RoutingRecord

DOMAINS = ["code", "stories", "plays"]


def make_record(layers_rows: list[list[list[int]]], domain: list[int], token_ids: list[int],
                generated: list[bool] | None = None, layers: list[int] | None = None,
                n_experts: int = 4) -> RoutingRecord:
    n = len(domain)
    return RoutingRecord(layers=layers or list(range(len(layers_rows))), n_experts=n_experts,
                         top_k=len(layers_rows[0][0]), experts_LNK=torch.tensor(layers_rows, dtype=torch.long),
                         token_ids_N=torch.tensor(token_ids), domain_N=torch.tensor(domain),
                         window_N=torch.zeros(n, dtype=torch.long),
                         generated_N=torch.tensor(generated if generated is not None else [False] * n))


@pytest.fixture
def planted() -> RoutingRecord:
    """E=4, k=2, MoE layers 1 and 2 (layer 0 dense), three domains of 12 tokens. Layer 1: expert 3
    takes every token of domain 0 (code) and nothing else; experts 0 and 1 are always chosen
    together outside code. Layer 2: every pair in turn, for every domain alike."""
    pairs = list(itertools.combinations(range(4), 2))
    layer1, layer2, domain, ids = [], [], [], []
    for d in range(3):
        for i in range(12):
            layer1.append([3, i % 3] if d == 0 else [0, 1])
            layer2.append(list(pairs[i % 6]))
            domain.append(d)
            ids.append(10 * d + i % 4)
    return make_record([layer1, layer2], domain, ids, layers=[1, 2])


class CharDecoder:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{i}>" for i in ids)


@pytest.fixture
def results(planted) -> dict:
    """results.json's sections for the planted record (saturation and agreement made up), as the
    task assembles them before plotting."""
    from eval.analysis import stats, summary

    masks = summary.layer_masks(planted)
    engine_loads = [[stats.load(m[planted.domain_N == d]).tolist() for m in masks] for d in range(3)]
    generation = summary.generation_section(DOMAINS, engine_loads, planted, planted)
    generation.update(prompts_per_domain=2, prompt_tokens=4, new_tokens=2, temperature=1.0,
                      engine={"tokens_routed": 36}, samples={})
    return {
        "model": {"n_layers": 3, "moe_layers": [1, 2], "n_experts": 4, "top_k": 2, "router": "topk"},
        "checkpoint": {"path": "/runs/x/checkpoints/step_0000008.pt", "step": 8},
        "domain_sources": {"code": "pystdlib", "stories": "stories.txt", "plays": "plays.txt"},
        "tokens_analysed": planted.n_tokens, "timing": {"collect_seconds": 0.5},
        "domain_specialization": summary.domain_section(planted, DOMAINS),
        "vocabulary": summary.vocabulary_section(planted, CharDecoder(), 3, 2, 1),
        "coactivation": summary.coactivation_section(planted),
        "saturation": {"reference_step": 8, "probe_tokens": 36, "layers": [1, 2], "checkpoints": [
            {"step": 2, "overlap": [0.5, 0.25], "exact": [0.1, 0.0], "mean_overlap": 0.375},
            {"step": 8, "overlap": [1.0, 1.0], "exact": [1.0, 1.0], "mean_overlap": 1.0}]},
        "agreement": {"other": {"path": "/runs/y/checkpoints/step_0000004.pt", "top_k": 1, "dtype": "bf16"},
                      "probe_tokens": 36, "layers": summary.overlap_by_layer(planted, planted), "mean_overlap": 1.0},
        "generation": generation,
    }
