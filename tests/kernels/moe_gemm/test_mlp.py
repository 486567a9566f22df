"""`kernels/moe_gemm/mlp.py`: the expert MLP's forward and backward as kernel launches, against
`moe_mlp_reference` and autograd through it (the autograd Function built on them is tested in
tests/experts/test_triton_mlp.py)."""

import pytest
import torch

from kernels.moe_gemm import (expert_mlp_backward, expert_mlp_forward, moe_mlp_reference, moe_routing,
                              sorted_weights)
from tests.kernels.moe_gemm.cases import SMALL, fwd_bwd, mlp_case

pytest.importorskip("triton")


def test_sorted_weights_follow_the_routing_order():
    x, experts, weights, gate_up, down = mlp_case(9, 8, 4, 3, 2, True, torch.float32)
    r = moe_routing(experts, 3, 16)
    w = sorted_weights(weights.double(), r)
    assert w.dtype == torch.float32 and w.is_contiguous()
    assert w.tolist() == [weights.reshape(-1)[a].item() for a in r.sorted_assign.tolist()]


@pytest.mark.parametrize("T,D,H,E,K,drop", [(23, 20, 17, 5, 2, True), (16, 8, 12, 3, 1, False)])
def test_forward_and_backward_equal_the_reference_and_its_autograd(T, D, H, E, K, drop):
    inputs = mlp_case(T, D, H, E, K, drop, torch.float32)
    x, experts, weights, gate_up, down = inputs
    y_ref, gy, grads_ref = fwd_bwd(moe_mlp_reference, inputs)
    r = moe_routing(experts, E, 16)
    w_sorted = sorted_weights(weights, r)
    y, gu = expert_mlp_forward(x, w_sorted, gate_up, down, r, store_gate_up=True, tiles=SMALL)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    grads = expert_mlp_backward(gy, x, gate_up, down, gu, w_sorted, r, needs=(True,) * 4, tiles=SMALL)
    assert grads[1].dtype == torch.float32 and grads[1].shape == (T, K)
    for name, g, g_ref in zip(("x", "router weights", "gate_up", "down"), grads, grads_ref):
        torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4, msg=lambda m: f"d{name}: {m}")


def test_backward_computes_only_what_is_needed():
    x, experts, weights, gate_up, down = mlp_case(12, 8, 4, 3, 2, False, torch.float32)
    r = moe_routing(experts, 3, 16)
    w_sorted = sorted_weights(weights, r)
    y, gu = expert_mlp_forward(x, w_sorted, gate_up, down, r, store_gate_up=True, tiles=SMALL)
    all4 = expert_mlp_backward(torch.ones_like(y), x, gate_up, down, gu, w_sorted, r, needs=(True,) * 4, tiles=SMALL)
    for i in range(4):
        needs = [j == i for j in range(4)]
        got = expert_mlp_backward(torch.ones_like(y), x, gate_up, down, gu, w_sorted, r, needs=needs, tiles=SMALL)
        assert [g is not None for g in got] == needs
        assert torch.equal(got[i], all4[i])
    y2, none = expert_mlp_forward(x, w_sorted, gate_up, down, r, store_gate_up=False, tiles=SMALL)
    assert none is None and torch.equal(y2, y)
