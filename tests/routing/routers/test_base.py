"""The router base (`moe/routing/routers/base.py`): experts in `router.drop_experts` are never selected by
any router variant, and the softmax runs over the experts left."""

from __future__ import annotations

import pytest
import torch

from moe.routing.routers import build_router
from moe.routing.routers import router_config

@pytest.mark.parametrize("name, kw", [("topk", {}), ("switch", dict(top_k=1, renormalize=False)),
                                      ("aux_free", dict(score_func="sigmoid")), ("sinkhorn", {}),
                                      ("expert_choice", dict(capacity_factor=1.0))])
def test_dropped_experts_are_never_selected(name, kw):
    torch.manual_seed(0)
    cfg = router_config(name=name, **{"top_k": 2, **kw, "drop_experts": [1, 4]})
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
    full = build_router(router_config(top_k=2, renormalize=False), 16, 6).eval()
    torch.nn.init.normal_(full.weight)
    dropped = build_router(router_config(top_k=2, renormalize=False, drop_experts=[0, 3]), 16, 6).eval()
    dropped.weight = full.weight
    x = torch.randn(32, 16)
    keep = [1, 2, 4, 5]
    expected = torch.softmax(full.logits(x)[:, keep], dim=-1)
    torch.testing.assert_close(dropped(x).probs_TE[:, keep], expected)


