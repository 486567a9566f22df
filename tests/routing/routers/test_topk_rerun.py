"""The topk router's group limit with DeepSeek-V3's group score (`group_score_top`), through the
router itself (docs/results/mutation/rerun2/: the second run's modules re-run; this kills the
mutants that drop `topk_groups` or `group_score_top` from the router's call of the group mask)."""

import torch

from moe.routing.routers import build_router, router_config
from tests.routing.routers.group_reference import kept_groups


def _reference_experts(probs_TE: torch.Tensor, n_groups: int, topk_groups: int, score_top: int, k: int) -> list:
    """Per token: groups scored by the sum of their best `score_top` probabilities, the best
    `topk_groups` groups kept, then the k most probable experts among the kept ones."""
    T, E = probs_TE.shape
    per = E // n_groups
    out = []
    for t in range(T):
        p = probs_TE[t].tolist()
        kept = kept_groups(p, n_groups, topk_groups, score_top)
        allowed = [e for e in range(E) if e // per in kept]
        out.append(sorted(sorted(allowed, key=lambda e: -p[e])[:k]))
    return out


def test_topk_group_limit_scores_groups_by_their_best_group_score_top_experts():
    """8 experts in 4 groups, one group kept, a group scored by its best two: the router's choice
    equals the reference, and this example's choice differs both from scoring a group by its best
    expert alone and from keeping two groups (so the options are really exercised)."""
    torch.manual_seed(0)
    E, G, T = 8, 4, 64
    r = build_router(router_config("topk", top_k=2, n_groups=G, topk_groups=1, group_score_top=2,
                                   renormalize=False), 16, E).eval()
    torch.nn.init.normal_(r.weight, 0.0, 1.0)
    x = torch.randn(T, 16)
    out = r(x)
    probs = torch.softmax(r.logits(x), dim=-1)
    got = [sorted(row) for row in out.experts_TK.tolist()]
    assert got == _reference_experts(probs, G, 1, 2, 2)
    assert got != _reference_experts(probs, G, 1, 1, 2)  # a group scored by its best expert only
    assert got != _reference_experts(probs, G, 2, 1, 2)  # two groups kept
