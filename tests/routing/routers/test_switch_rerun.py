"""The switch router's group limit with DeepSeek-V3's group score (`group_score_top`)
(docs/results/mutation/rerun2/: kills the mutants that drop `topk_groups` or `group_score_top`
from the router's call of the group mask)."""

import torch

from moe.routing.routers import build_router, router_config
from tests.routing.routers.test_topk_rerun import _reference_experts


def test_switch_group_limit_scores_groups_by_their_best_group_score_top_experts():
    """Top-1 in the best of 4 groups, a group scored by the sum of its best two: a token's expert is
    then not always its most probable one (a group scored by its best expert alone always holds
    it), and the router's choice equals the reference."""
    torch.manual_seed(0)
    E, G, T = 8, 4, 64
    r = build_router(router_config("switch", top_k=1, n_groups=G, topk_groups=1, group_score_top=2), 16, E).eval()
    torch.nn.init.normal_(r.weight, 0.0, 1.0)
    x = torch.randn(T, 16)
    got = r(x).experts_TK.tolist()
    probs = torch.softmax(r.logits(x), dim=-1)
    assert got == _reference_experts(probs, G, 1, 2, 1)
    assert got != probs.argmax(dim=-1, keepdim=True).tolist()  # not the unrestricted top-1
    assert got != _reference_experts(probs, G, 2, 1, 1)  # two groups kept
