"""`kernels/moe_gemm/reference.py`: the PyTorch references (which define what the kernels must
compute) against the most literal formulas, one assignment at a time, and against autograd."""

import pytest
import torch

from kernels.moe_gemm import (gate_up_swiglu_reference, group_weight_grad_reference, grouped_gemm_reference,
                              moe_mlp_reference, moe_routing, swiglu_down_backward_reference)
from moe.experts import EXPERT_DISPATCH
from tests.kernels.moe_gemm.cases import mlp_case, rand, routing_case

T, E, K = 23, 5, 3


@pytest.fixture
def case():
    experts, weights = routing_case(T, E, K)
    r = moe_routing(experts, E, 16)
    return experts, weights, r


def _assignments(r):
    """(sorted position p, token t, assignment row t*K+k, expert e) of every non-dropped assignment."""
    for p, (a, e) in enumerate(zip(r.sorted_assign.tolist(), r.sorted_expert.tolist())):
        if e < r.n_experts:
            yield p, a // r.top_k, a, e


@pytest.mark.parametrize("x_grouped,y_grouped,trans_w,with_scale", [
    (False, True, True, False), (True, False, True, True), (True, False, False, False), (False, False, False, True)])
def test_grouped_gemm_reference_is_one_product_per_assignment(case, x_grouped, y_grouped, trans_w, with_scale):
    experts, weights, r = case
    x = rand(r.n_assign if x_grouped else T, 7)
    w = rand(E, 9, 7) if trans_w else rand(E, 7, 9)
    scale = weights.reshape(-1)[r.sorted_assign.long()].float() if with_scale else None
    got = grouped_gemm_reference(x, w, r, x_grouped=x_grouped, y_grouped=y_grouped, trans_w=trans_w, scale=scale)
    want = torch.zeros(r.n_assign, 9)  # dropped assignments' rows stay zero
    for p, t, a, e in _assignments(r):
        row = x[p if x_grouped else t] @ (w[e].t() if trans_w else w[e])
        want[p if y_grouped else a] = row * (scale[p] if with_scale else 1.0)
    torch.testing.assert_close(got, want)


def test_gate_up_swiglu_reference_is_silu_gate_times_up(case):
    _, _, r = case
    x, gate_up = rand(T, 6), rand(E, 2 * 4, 6)
    h, gu = gate_up_swiglu_reference(x, gate_up, r)
    assert h.shape == (r.n_assign, 4) and gu.shape == (r.n_assign, 8)
    for p, t, _, e in _assignments(r):
        pre = gate_up[e] @ x[t]
        torch.testing.assert_close(gu[p], pre)
        torch.testing.assert_close(h[p], torch.nn.functional.silu(pre[:4]) * pre[4:])


def test_swiglu_down_backward_reference_equals_autograd(case):
    """dgu, h and dw of `y[t] = sum_p w[p] * (silu(gate_p) * up_p) @ down[e_p]^T` for output gradient dy."""
    _, weights, r = case
    H, D = 4, 6
    gu = rand(r.n_assign, 2 * H).requires_grad_()
    w_sorted = weights.reshape(-1)[r.sorted_assign.long()].float().contiguous().requires_grad_()
    down, dy = rand(E, D, H), rand(T, D)
    gate, up = gu.chunk(2, dim=-1)
    h = torch.nn.functional.silu(gate) * up
    loss = sum(w_sorted[p] * (dy[t] @ (down[e] @ h[p])) for p, t, _, e in _assignments(r))
    loss.backward()
    dgu, h_ref, dw = swiglu_down_backward_reference(dy, down, gu.detach(), w_sorted.detach(), r)
    torch.testing.assert_close(h_ref, h.detach())
    torch.testing.assert_close(dgu, gu.grad)
    dropped = r.sorted_expert == E
    torch.testing.assert_close(dw[~dropped], w_sorted.grad[~dropped])


@pytest.mark.parametrize("a_grouped,b_grouped,with_scale", [(True, False, False), (False, True, True)])
def test_group_weight_grad_reference_sums_outer_products_per_expert(case, a_grouped, b_grouped, with_scale):
    _, weights, r = case
    a, b = rand(r.n_assign if a_grouped else T, 5), rand(r.n_assign if b_grouped else T, 3)
    scale = weights.reshape(-1)[r.sorted_assign.long()].float() if with_scale else None
    got = group_weight_grad_reference(a, b, r, a_grouped=a_grouped, b_grouped=b_grouped, scale=scale)
    want = torch.zeros(E, 5, 3)
    for p, t, _, e in _assignments(r):
        ra = a[p if a_grouped else t] * (scale[p] if with_scale else 1.0)
        want[e] += torch.outer(ra, b[p if b_grouped else t])
    torch.testing.assert_close(got, want)
    assert bool((got[0] == 0).all()), "expert 0 has no tokens in this case"


@pytest.mark.parametrize("drop", [False, True])
def test_moe_mlp_reference_equals_the_loop_dispatch(drop):
    inputs = mlp_case(31, 12, 10, 6, 2, drop, torch.float32)
    torch.testing.assert_close(moe_mlp_reference(*inputs), EXPERT_DISPATCH.get("loop")(*inputs))
