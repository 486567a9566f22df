"""The router base (`moe/routing/routers/base.py`): experts in `router.drop_experts` are never selected by
any router variant, and the softmax runs over the experts left."""

from __future__ import annotations

import pytest
import torch

from moe.config import RouterConfig
from moe.routing.routers import build_router

@pytest.mark.parametrize("name, kw", [("topk", {}), ("switch", dict(top_k=1, renormalize=False)),
                                      ("aux_free", dict(score_func="sigmoid")), ("sinkhorn", {}),
                                      ("expert_choice", dict(capacity_factor=1.0))])
def test_dropped_experts_are_never_selected(name, kw):
    torch.manual_seed(0)
    cfg = RouterConfig(name=name, **{"top_k": 2, **kw, "drop_experts": [1, 4]})
    router = build_router(cfg, 16, 6).eval()
    torch.nn.init.normal_(router.weight)
    if name == "aux_free":  # a bias that would pull every token to the dropped experts
        router.e_score_correction_bias[[1, 4]] = 100.0
    x = torch.randn(64, 16)
    x[:, :] += 3 * router.weight[1]  # inputs that favour a dropped expert
    out = router(x)
    assert not torch.isin(out.experts_TK, torch.tensor([1, 4])).any()
    assert (out.probs_TE[:, [1, 4]] == 0).all()
    assert out.experts_TK.shape[1] == cfg.top_k and torch.isfinite(out.loss)

def test_the_softmax_runs_over_the_experts_left():
    torch.manual_seed(0)
    full = build_router(RouterConfig(top_k=2, renormalize=False), 16, 6).eval()
    torch.nn.init.normal_(full.weight)
    dropped = build_router(RouterConfig(top_k=2, renormalize=False, drop_experts=[0, 3]), 16, 6).eval()
    dropped.weight = full.weight
    x = torch.randn(32, 16)
    keep = [1, 2, 4, 5]
    expected = torch.softmax(full.logits(x)[:, keep], dim=-1)
    torch.testing.assert_close(dropped(x).probs_TE[:, keep], expected)


def test_router_scores_refuses_an_unknown_score_func_naming_the_choices():
    from moe.errors import ConfigError
    from moe.routing.routers.base import router_scores
    with pytest.raises(ConfigError, match=r"^router.score_func='relu' is not allowed; choose one of \['softmax', 'sigmoid'\]$"):
        router_scores(torch.zeros(2, 3), "relu")
