"""`moe/routing/routers/base.py`: tests from the re-run of the first mutation run's modules
(docs/results/mutation/rerun1b/, helper mutK): the option checks' exact messages and bounds."""

import re

import pytest
import torch

from moe.errors import ConfigError
from moe.routing.routers.base import GroupLimitedConfig, RouterConfig
from tests.routing.routers.group_reference import kept_groups


def _refused(cfg, n_experts, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message) + "$"):
        cfg.check(n_experts)


@pytest.mark.parametrize("fields, message", [
    (dict(top_k=0), "router.top_k=0 must be > 0 (and finite)"),
    (dict(top_k=5), "router.top_k=5 must be <= model.n_experts=4"),
    (dict(drop_experts=[4]), "router.drop_experts=[4] must hold distinct indices in [0, model.n_experts=4)"),
    (dict(top_k=3, drop_experts=[0, 1]),
     "router.top_k=3 must be <= the 2 experts left after router.drop_experts=[0, 1]"),
    (dict(temperature=0.0), "router.temperature=0.0 must be > 0 (and finite)"),
    (dict(aux_loss_coef=-0.5), "router.aux_loss_coef=-0.5 must be >= 0 (and finite)"),
    (dict(z_loss_coef=-0.5), "router.z_loss_coef=-0.5 must be >= 0 (and finite)"),
    (dict(jitter=1.0), "router.jitter=1.0 must be in [0.0, 1.0)"),
    (dict(jitter=-0.1), "router.jitter=-0.1 must be in [0.0, 1.0)"),
    (dict(capacity_factor=0.0), "router.capacity_factor=0.0 must be > 0 (and finite)"),
])
def test_router_config_check_names_the_bad_option(fields, message):
    _refused(RouterConfig(**fields), 4, message)


@pytest.mark.parametrize("fields", [
    dict(top_k=4), dict(top_k=2, drop_experts=[0, 1]), dict(aux_loss_coef=0.0, z_loss_coef=0.0),
    dict(jitter=0.0), dict(jitter=0.5), dict(capacity_factor=None), dict(capacity_factor=0.5), dict(temperature=1e-3),
])
def test_router_config_check_accepts_the_bounds(fields):
    RouterConfig(**fields).check(4)  # must not raise


@pytest.mark.parametrize("fields, message", [
    (dict(n_groups=0), "router.n_groups=0 must be > 0 (and finite)"),
    (dict(n_groups=3), "model.n_experts=8 must be divisible by router.n_groups=3"),
    (dict(n_groups=2, group_score_top=0),
     "router.group_score_top=0 must be in [1, the 4 experts of a group (model.n_experts / router.n_groups)]"),
    (dict(n_groups=2, group_score_top=5),
     "router.group_score_top=5 must be in [1, the 4 experts of a group (model.n_experts / router.n_groups)]"),
    (dict(n_groups=2, topk_groups=0), "router.topk_groups=0 must be in [1, router.n_groups=2]"),
    (dict(n_groups=2, topk_groups=3), "router.topk_groups=3 must be in [1, router.n_groups=2]"),
    (dict(top_k=9), "router.top_k=9 must be <= model.n_experts=8"),  # the base checks run first
])
def test_group_limited_check_names_the_bad_option(fields, message):
    _refused(GroupLimitedConfig(**fields), 8, message)


@pytest.mark.parametrize("fields", [
    dict(n_groups=1), dict(n_groups=8, group_score_top=1, topk_groups=8), dict(n_groups=2, group_score_top=4),
    dict(n_groups=2, topk_groups=2), dict(n_groups=4, group_score_top=2, topk_groups=1),
])
def test_group_limited_check_accepts_the_bounds(fields):
    GroupLimitedConfig(**fields).check(8)  # must not raise


def test_check_model_reads_the_models_expert_count():
    class Model:
        n_experts = 2
    RouterConfig(top_k=2).check_model(Model())
    with pytest.raises(ConfigError, match=r"^router\.top_k=3 must be <= model\.n_experts=2$"):
        RouterConfig(top_k=3).check_model(Model())


def _drop_reference(experts_TK, n_experts, capacity):
    """Switch/GShard priority, one assignment at a time: slot-major (every first choice before any second
    choice), earlier tokens first within a slot; an expert takes at most `capacity`."""
    T, K = experts_TK.shape
    taken, keep = [0] * (n_experts + 1), torch.zeros(T, K, dtype=torch.bool)
    for k in range(K):
        for t in range(T):
            e = int(experts_TK[t, k])
            if e < n_experts and taken[e] < capacity:
                taken[e] += 1
                keep[t, k] = True
    return keep


def test_drop_over_capacity_keeps_earlier_tokens_first_among_hundreds_of_ties():
    # Hundreds of assignments to 4 experts: a sort that is not stable (torch's CPU argsort is not, from
    # about a hundred elements) reorders tokens within an expert and drops later tokens' rivals instead.
    from moe.routing.routers.base import drop_over_capacity
    g = torch.Generator().manual_seed(0)
    T, K, E, cap = 300, 2, 4, 120
    experts = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    experts[::17, 1] = E  # some assignments already dropped (the sentinel), never counted
    weights = torch.rand(T, K, generator=g)
    kept, w, n = drop_over_capacity(experts, weights, E, cap)
    keep = _drop_reference(experts, E, cap)
    assert torch.equal(kept, torch.where(keep, experts, torch.full_like(experts, E)))
    assert torch.equal(w, torch.where(keep, weights, torch.zeros_like(weights)))
    assert int(n) == int((~keep & (experts < E)).sum()) > 0


def test_drop_over_capacity_makes_its_ranks_on_the_inputs_device():
    # Under a `meta` default device, a factory call without `device=` makes a meta tensor that cannot meet the
    # CPU inputs: the CPU alone tells a dropped `device=flat.device` from the right one.
    from moe.routing.routers.base import drop_over_capacity
    experts = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])
    weights = torch.rand(4, 2, generator=torch.Generator().manual_seed(1))
    want = drop_over_capacity(experts, weights, 3, 2)
    with torch.device("meta"):
        got = drop_over_capacity(experts, weights, 3, 2)
    assert all(t.device.type == "cpu" for t in got)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and int(got[2]) == int(want[2]) == 3


def _group_mask_reference(scores_TE, n_groups, topk_groups, score_top):
    """Per token: each group scores by the sum of its best `score_top` experts; the best `topk_groups`
    groups keep their experts, the others get -inf."""
    T, E = scores_TE.shape
    out = scores_TE.clone()
    size = E // n_groups
    for t in range(T):
        best = kept_groups(scores_TE[t].tolist(), n_groups, topk_groups, score_top)
        for g in range(n_groups):
            if g not in best:
                out[t, g * size:(g + 1) * size] = float("-inf")
    return out


@pytest.mark.parametrize("score_top", [1, 2, 3])
def test_group_limited_mask_scores_groups_by_their_best_experts_sum(score_top):
    # DeepSeek-V3 scores a group by the sum of its best two experts: token 0's group 0 has the single best
    # expert but group 1 the best pair, so the best-expert rule (score_top 1) and the pair rule disagree.
    from moe.routing.routers.base import group_limited_mask
    scores = torch.tensor([[0.90, 0.00, 0.00, 0.80, 0.70, 0.00, 0.10, 0.20, 0.05],
                           [0.10, 0.20, 0.30, 0.05, 0.05, 0.60, 0.50, 0.40, 0.00]])
    got = group_limited_mask(scores, 3, 1, score_top)
    assert torch.equal(got, _group_mask_reference(scores, 3, 1, score_top))
    kept_group_of_token_0 = 0 if score_top == 1 else 1
    assert torch.isfinite(got[0]).nonzero().flatten().div(3, rounding_mode="floor").unique().tolist() == [kept_group_of_token_0]
    g = torch.Generator().manual_seed(score_top)
    many = torch.rand(40, 12, generator=g)
    assert torch.equal(group_limited_mask(many, 4, 2, score_top), _group_mask_reference(many, 4, 2, score_top))


def _router(**fields):
    from moe.routing.routers import build_router, router_config
    r = build_router(router_config(top_k=2, **fields), d_model=6, n_experts=4)
    torch.nn.init.normal_(r.weight, generator=torch.Generator().manual_seed(0))
    return r


def test_router_logits_add_the_gate_bias():
    # GPT-OSS's gate has a bias (model.router_bias): the logits are x W^T + b, in fp32
    r = _router()
    r.bias = torch.nn.Parameter(torch.tensor([0.5, -1.0, 0.0, 2.0]))
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(r.logits(x), x @ r.weight.t() + r.bias, atol=1e-6)


def test_router_without_jitter_draws_no_random_numbers_in_training():
    # jitter 0 in training: the input is used as it is and the global RNG is not advanced (a draw would
    # shift every later random number of the run, dropout's and sampling's, against a run without it)
    r = _router(jitter=0.0).train()
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(2))
    state = torch.get_rng_state()
    out = r.logits(x)
    assert torch.equal(torch.get_rng_state(), state) and torch.equal(out, x @ r.weight.t())


def test_router_masks_and_counts_on_the_inputs_device():
    # Under a `meta` default device, the dropped experts' index and the drop count must still be made
    # on the inputs' device (a factory call without `device=` would make meta tensors)
    r = _router(drop_experts=[1]).eval()
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(3))
    experts = torch.tensor([[0, 2], [3, 2], [0, 3]])
    with torch.device("meta"):
        scores = r.without_dropped(torch.zeros(3, 4, device="cpu"))
        _, _, n = r._capacity(experts, torch.ones(3, 2, device="cpu"), False, 2)
        _, _, none = r._capacity(experts, torch.ones(3, 2, device="cpu"), False, None)
    assert scores.device.type == "cpu" and torch.isinf(scores[:, 1]).all() and torch.isfinite(scores[:, [0, 2, 3]]).all()
    assert n.device.type == "cpu" and n.dtype == torch.long and int(n) == 2
    assert none.device.type == "cpu" and none.dtype == torch.long and int(none) == 0  # no count given: zero
    _, _, n32 = r._capacity(experts, torch.ones(3, 2), False, torch.tensor(5, dtype=torch.int32))
    assert n32.dtype == torch.long and int(n32) == 5  # the count is int64 whatever the variant passed
    assert torch.isinf(r.logits(x)[:, 1]).all()


def test_inference_path_in_training_mode_is_refused_with_its_reason():
    r = _router().train()
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(4))
    with pytest.raises(ValueError, match="^" + re.escape(
            "need_losses=False (the inference path) with the router in training mode: its losses are what it "
            "trains on; call model.eval() first") + "$"):
        r(x, need_losses=False)
