"""The hash router's inference path (`need_losses=False`) routes dropless like its full eval path
(docs/results/mutation/rerun2/: kills the mutant that drops `apply_capacity=self.training` from
that path's `finish` call, whose default would apply the capacity factor at inference)."""

import torch

from moe.routing.routers import build_router, router_config


def test_hash_inference_path_is_dropless_under_a_capacity_factor():
    torch.manual_seed(0)
    E, T = 4, 32
    r = build_router(router_config("hash", top_k=2, capacity_factor=0.5), 8, E)
    x, ids = torch.randn(T, 8), torch.randint(0, 50, (T,))
    trained = r.train()(x, ids)
    assert int(trained.n_dropped) > 0  # the factor bites in training (so it would at inference)
    full, fast = r.eval()(x, ids), r(x, ids, need_losses=False)
    assert int(fast.n_dropped) == 0 and not (fast.experts_TK == E).any()
    assert torch.equal(fast.experts_TK, full.experts_TK) and torch.equal(fast.weights_TK, full.weights_TK)
