"""Proposers (moe/engine/speculative/proposers.py) at their edges: the gaps the fifth mutation run
found (docs/results/mutation/run4_engine/README.md). test_proposers.py checks the lookup against
a plain search and the self-drafting forward; these check the self-drafting model's refusals (each
message names the field and the allowed range) and which routers it rebuilds."""

from __future__ import annotations

import pytest
import torch

from moe.engine.speculative.proposers import SelfDraftModel
from moe.errors import ConfigError


@pytest.fixture(scope="module")
def three_layers(make_model):
    return make_model(260, n_layers=3)


@pytest.mark.parametrize("skip", [(3,), (0, 1, 2), (0, 1, 2, 5)])
def test_self_draft_refuses_skipping_a_missing_layer_or_every_layer(three_layers, skip):
    with pytest.raises(ConfigError, match=rf"^speculative\.skip_layers={list(skip)!r} "
                                          r"must name some, not all, of the model's layers 0\.\.2$".replace("[", r"\[")):
        SelfDraftModel(three_layers, top_k=None, skip_layers=skip)


def test_self_draft_refuses_a_top_k_above_the_models_and_a_pass_no_cheaper(three_layers):
    with pytest.raises(ConfigError, match=r"^speculative\.top_k=3 must be <= the model's router top_k=2$"):
        SelfDraftModel(three_layers, top_k=3, skip_layers=(1,))
    for top_k in (None, 2):
        with pytest.raises(ConfigError, match=r"^speculative method 'self' needs a cheaper drafting pass: a top_k "
                                              r"below the model's 2 and/or skip_layers$"):
            SelfDraftModel(three_layers, top_k=top_k, skip_layers=())


@torch.no_grad()
def test_the_models_own_top_k_with_skipped_layers_rebuilds_no_router(three_layers):
    """top_k equal to the model's is allowed beside skip_layers (the top_k <= bound), and the
    drafting pass then routes exactly as the target: no router rebuilt, the target's config kept."""
    draft = SelfDraftModel(three_layers, top_k=2, skip_layers=(2,))
    assert draft.routers == {} and draft.cfg.router.top_k == 2
    plain = SelfDraftModel(three_layers, top_k=None, skip_layers=(2,))
    assert plain.cfg is three_layers.cfg
    ids = torch.randint(4, 260, (1, 7), generator=torch.Generator().manual_seed(3))
    pos = torch.arange(7).unsqueeze(0)
    assert torch.equal(draft(ids, pos, None).logits, plain(ids, pos, None).logits)


@torch.no_grad()
def test_self_draft_rebuilds_the_routers_of_the_moe_layers_it_runs_only(make_model):
    """A dense first layer has no router to rebuild; a skipped MoE layer needs none."""
    model = make_model(260, n_layers=3, n_dense_layers=1)
    draft = SelfDraftModel(model, top_k=1, skip_layers=(2,))
    assert sorted(draft.routers) == [1]
    assert draft.routers[1].weight is model.layers[1].ffn.router.weight  # shared, not copied
    ids = torch.randint(4, 260, (1, 5), generator=torch.Generator().manual_seed(4))
    out = draft(ids, torch.arange(5).unsqueeze(0), None)
    assert out.logits.shape == (1, 5, 260) and out.moe_records == []
    assert model.layers[1].ffn.router is not draft.routers[1]  # the target's router is back after the pass
