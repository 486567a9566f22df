import math

import pytest
import torch

from moe.routing.routers import build_router
from moe.routing.routers import router_config
from moe.routing.routers.base import (drop_over_capacity, expert_capacity, group_limited_mask, load_balancing_loss,
                              top_k_choice, z_loss)


def test_aux_loss_hand_computed():
    # 4 tokens, 2 experts, top-1. Tokens 0,1,2 pick expert 0; token 3 picks expert 1.
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])
    experts = torch.tensor([[0], [0], [0], [1]])
    # f = [3/4, 1/4]; P = [0.65, 0.35]; loss = 2 * (0.75*0.65 + 0.25*0.35) = 1.15
    assert float(load_balancing_loss(probs, experts, 2)) == pytest.approx(1.15)
    # A uniform router scores exactly 1 at any top_k.
    uniform = torch.full((6, 3), 1 / 3)
    assert float(load_balancing_loss(uniform, torch.tensor([[0, 1], [1, 2], [2, 0]] * 2), 3)) == pytest.approx(1.0)


def test_z_loss_hand_computed():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    expected = (math.log(2.0) ** 2 + math.log(4.0) ** 2) / 2
    assert float(z_loss(logits)) == pytest.approx(expected)


def test_topk_router_matches_definition():
    torch.manual_seed(1)
    cfg = router_config(top_k=2, temperature=2.0)
    r = build_router(cfg, d_model=8, n_experts=5)
    torch.nn.init.normal_(r.weight)
    x = torch.randn(7, 8)
    out = r(x)
    logits = (x @ r.weight.T) / 2.0
    probs = torch.softmax(logits, -1)
    top, idx = probs.topk(2, dim=-1)
    assert torch.equal(out.experts_TK, idx)
    torch.testing.assert_close(out.weights_TK, top / top.sum(-1, keepdim=True))
    torch.testing.assert_close(out.probs_TE, probs)
    assert out.n_dropped == 0
    out2 = build_router(router_config(top_k=2, renormalize=False), 8, 5)
    out2.load_state_dict(r.state_dict())
    torch.testing.assert_close(out2(x).weights_TK, torch.softmax(x @ r.weight.T, -1).topk(2, -1).values)


def test_capacity_drops_are_counted_and_follow_priority():
    # 6 tokens, top-2, 3 experts: capacity = ceil(1.0 * 12 / 3) = 4
    experts = torch.tensor([[0, 1], [0, 2], [0, 1], [0, 1], [0, 2], [1, 0]])
    weights = torch.ones(6, 2)
    cap = expert_capacity(experts.numel(), 3, 1.0)
    assert cap == 4
    kept, w, n = drop_over_capacity(experts, weights, 3, cap)
    # expert 0: first choices of tokens 0..4 (5 of them) fill 4 slots -> token 4's first
    # choice and token 5's second choice (lower priority) are dropped.
    assert int(n) == 2
    assert kept[4, 0] == 3 and kept[5, 1] == 3 and w[4, 0] == 0 and w[5, 1] == 0
    # expert 1: tokens 0,2,3 second choice + token 5 first choice = 4 -> all kept
    assert (kept == 1).sum() == 4
    counts = torch.bincount(kept.flatten(), minlength=4)
    assert counts[:3].max() <= cap


def test_router_capacity_factor_end_to_end():
    r = build_router(router_config(top_k=1, capacity_factor=1.0), d_model=4, n_experts=2)
    with torch.no_grad():
        r.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [-1.0, 0, 0, 0]]))
    x = torch.zeros(10, 4)
    x[:, 0] = 1.0  # every token prefers expert 0; capacity = 5
    out = r(x)
    assert int(out.n_dropped) == 5
    assert (out.experts_TK == 0).sum() == 5 and (out.experts_TK == 2).sum() == 5


def test_jitter_only_in_training_and_group_limit():
    r = build_router(router_config(top_k=1, jitter=0.5), d_model=4, n_experts=4)
    torch.nn.init.normal_(r.weight)
    x = torch.randn(16, 4)
    r.eval()
    torch.testing.assert_close(r(x).probs_TE, r(x).probs_TE)
    r.train()
    assert not torch.allclose(r(x).probs_TE, r(x).probs_TE)
    g = build_router(router_config(top_k=2, n_groups=2, topk_groups=1), d_model=4, n_experts=4)
    torch.nn.init.normal_(g.weight)
    out = g(torch.randn(32, 4))
    # both chosen experts come from the same group of two
    assert torch.equal(out.experts_TK[:, 0] // 2, out.experts_TK[:, 1] // 2)


def test_router_gradients_flow_through_weights_and_aux_loss():
    r = build_router(router_config(top_k=2, aux_loss_coef=1.0), d_model=6, n_experts=4)
    torch.nn.init.normal_(r.weight)
    out = r(torch.randn(9, 6))
    (out.weights_TK.sum() * 0 + out.loss).backward()
    assert r.weight.grad is not None and r.weight.grad.abs().sum() > 0


def test_capacity_priority_is_slot_major_not_token_major():
    """Separates the two plausible orders (the example above drops the same assignments under
    both). 3 tokens, top-2, 2 experts, capacity ceil(0.5 * 6 / 2) = 2; expert 0 is wanted by
    token 0 (first choice), token 1 (second choice) and token 2 (first choice).
    Slot-major (Switch/GShard: every first choice before any second choice) keeps tokens 0 and 2
    and drops token 1's second choice. Rules out token-major order (token 0's choices, then
    token 1's, ...), which would keep tokens 0 and 1 and drop token 2's FIRST choice."""
    experts = torch.tensor([[0, 1], [1, 0], [0, 1]])
    cap = expert_capacity(experts.numel(), 2, 0.5)
    assert cap == 2
    kept, w, n = drop_over_capacity(experts, torch.ones(3, 2), 2, cap)
    assert kept.tolist() == [[0, 1], [1, 2], [0, 2]] and int(n) == 2
    assert w.tolist() == [[1, 1], [1, 0], [1, 0]]


def test_capacity_ignores_assignments_already_dropped():
    """A sentinel id (E, weight 0) in the input is neither kept, counted against a capacity, nor
    counted as a new drop (mutant: `<= n_experts` in the drop count)."""
    experts = torch.tensor([[0, 3], [0, 1], [3, 0], [1, 0]])  # E = 3: two slots already dropped
    weights = torch.tensor([[0.5, 0.0], [0.5, 0.5], [0.0, 1.0], [1.0, 1.0]])
    kept, w, n = drop_over_capacity(experts, weights, 3, 2)
    # expert 0: tokens 0, 1 (first choices) fill it; token 2's and 3's second choices are dropped
    assert kept.tolist() == [[0, 3], [0, 1], [3, 3], [1, 3]] and int(n) == 2
    assert w.tolist() == [[0.5, 0.0], [0.5, 0.5], [0.0, 0.0], [1.0, 0.0]]


def test_balance_loss_of_a_single_assignment():
    """One token, top-1 (T*K = 1): f = [1, 0], so the loss is E * P_0 (mutant: a normaliser
    clamped at 2 instead of 1 would halve it)."""
    probs = torch.tensor([[0.7, 0.3]])
    assert float(load_balancing_loss(probs, torch.tensor([[0]]), 2)) == pytest.approx(1.4)


@pytest.mark.parametrize("E,n_groups,topk_groups", [(12, 3, 2), (4, 2, 1), (8, 1, 1)])
def test_group_limited_mask_matches_a_per_token_loop(E, n_groups, topk_groups):
    """Each token keeps the experts of its `topk_groups` groups with the best single expert. 12
    experts in 3 groups (4 per group, not 3) rules out taking the max over the wrong axis of the
    [T, groups, per-group] view, which a square 2 x 2 view would not show; one group keeps all."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(7, E, generator=g)
    out = group_limited_mask(scores, n_groups, topk_groups)
    per = E // n_groups
    for t in range(scores.shape[0]):
        best = sorted(range(n_groups), key=lambda j: -float(scores[t, j * per:(j + 1) * per].max()))[:topk_groups]
        for e in range(E):
            expected = scores[t, e] if e // per in best else float("-inf")
            assert out[t, e] == expected, (t, e)


def test_renormalised_weights_that_all_underflow_are_zero_not_nan():
    """aux_free renormalises sigmoid scores, which underflow to exactly 0 for logits below ~-104 in
    fp32: the sum is clamped at `eps`, so such a token gets weights 0 instead of 0 / 0 = NaN."""
    scores_TE = torch.sigmoid(torch.tensor([[-200.0, -150.0, -120.0, -300.0], [0.0, 1.0, 2.0, -1.0]]))
    assert scores_TE[0].eq(0).all()
    experts_TK, weights_TK = top_k_choice(scores_TE, scores_TE, 2, renormalize=True, eps=1e-20)
    assert torch.equal(weights_TK[0], torch.zeros(2))
    torch.testing.assert_close(weights_TK[1].sum(), torch.tensor(1.0))
    assert experts_TK[1].tolist() == [2, 1]
    _, unclamped = top_k_choice(scores_TE, scores_TE, 2, renormalize=True)  # eps 0: the plain division
    assert unclamped[0].isnan().all()


def test_jitter_multiplies_the_input_by_uniform_noise_in_one_plus_minus_jitter():
    """Switch-Transformer jitter: x * u, u ~ U[1 - j, 1 + j] per element (not x / u, not another
    range), drawn from the global generator, then the gate and the temperature."""
    r = build_router(router_config(top_k=1, jitter=0.25, temperature=2.0), d_model=4, n_experts=3)
    torch.nn.init.normal_(r.weight)
    r.train()
    x = torch.randn(64, 4)
    torch.manual_seed(7)
    got = r.logits(x)
    torch.manual_seed(7)
    u = torch.empty_like(x).uniform_(0.75, 1.25)
    torch.testing.assert_close(got, (x * u) @ r.weight.t() / 2.0)


def test_finish_applies_capacity_by_default_and_counts_drops_as_int64():
    """`Router.finish` is what a new router calls: capacity applies unless it opts out (the
    documented default), and the drop count is an int64 scalar either way (summed across layers
    and steps as a count)."""
    r = build_router(router_config(top_k=1, capacity_factor=1.0), d_model=4, n_experts=2)
    probs_TE = torch.tensor([[0.9, 0.1]] * 4)
    experts_TK = torch.zeros(4, 1, dtype=torch.long)  # all four on expert 0; capacity is 2
    out = r.finish(experts_TK, probs_TE[:, :1], probs_TE, probs_TE.log())
    assert out.n_dropped.dtype == torch.long and int(out.n_dropped) == 2
    kept = r.finish(experts_TK, probs_TE[:, :1], probs_TE, probs_TE.log(), apply_capacity=False)
    assert kept.n_dropped.dtype == torch.long and kept.n_dropped.dim() == 0 and int(kept.n_dropped) == 0
