"""`kernels/moe_gemm/launch.py` with the kernels of `triton_kernels.py` (reachable only through
their launchers): each launcher against its PyTorch reference, in the Triton interpreter on CPU."""

import pytest
import torch

from kernels.moe_gemm import (gate_up_swiglu, gate_up_swiglu_reference, group_weight_grad, group_weight_grad_reference,
                              grouped_gemm, grouped_gemm_reference, moe_routing, runnable_reason, swiglu_down_backward,
                              swiglu_down_backward_reference)
from tests.kernels.moe_gemm.cases import SMALL, SMALL_W, rand, routing_case, tol

pytest.importorskip("triton")


@pytest.mark.parametrize("T,Din,Nout,E,K,dtype", [  # T, D_in, N_out, E, K
    (37, 20, 33, 5, 3, torch.float32), (50, 7, 9, 4, 4, torch.float32), (13, 16, 24, 3, 1, torch.float32),
    (37, 20, 33, 5, 3, torch.bfloat16)])
def test_grouped_gemm_matches_reference(T, Din, Nout, E, K, dtype):
    experts, weights = routing_case(T, E, K)
    r = moe_routing(experts, E, 16)
    N = T * K
    scale = weights.reshape(-1)[r.sorted_assign.long()].float().contiguous()
    for x_grouped, y_grouped, trans_w, with_scale in [(False, True, True, False), (True, False, True, True),
                                                      (True, False, False, False), (False, False, False, True)]:
        x = rand(N if x_grouped else T, Din, dtype=dtype)
        w = rand(E, Nout, Din, dtype=dtype) if trans_w else rand(E, Din, Nout, dtype=dtype)
        s = scale if with_scale else None
        got = grouped_gemm(x, w, r, x_grouped=x_grouped, y_grouped=y_grouped, trans_w=trans_w, scale=s, tiles=SMALL)
        ref = grouped_gemm_reference(x, w, r, x_grouped=x_grouped, y_grouped=y_grouped, trans_w=trans_w, scale=s)
        assert got.shape == (N, Nout) and got.dtype == dtype
        torch.testing.assert_close(got, ref, **tol(dtype))
        dropped = (r.sorted_expert == E) if y_grouped else (experts.reshape(-1) == E)
        assert bool((got[dropped] == 0).all()), "dropped assignments' rows must be zero"


@pytest.mark.parametrize("T,D,H,E,K,dtype", [
    (37, 20, 17, 5, 3, torch.float32), (50, 7, 24, 4, 2, torch.float32), (37, 20, 17, 5, 3, torch.bfloat16),
    (50, 7, 24, 4, 2, torch.float16)])
def test_gate_up_swiglu_matches_reference(T, D, H, E, K, dtype):
    experts, _ = routing_case(T, E, K)
    r = moe_routing(experts, E, 16)
    x, gu_w = rand(T, D, dtype=dtype), rand(E, 2 * H, D, dtype=dtype, scale=D ** -0.5)
    h, gu = gate_up_swiglu(x, gu_w, r, tiles=SMALL)
    h_ref, gu_ref = gate_up_swiglu_reference(x, gu_w, r)
    torch.testing.assert_close(gu, gu_ref, **tol(dtype))
    torch.testing.assert_close(h, h_ref, **tol(dtype))
    h2, none = gate_up_swiglu(x, gu_w, r, store_gate_up=False, tiles=SMALL)
    assert none is None and torch.equal(h2, h)


@pytest.mark.parametrize("T,D,H,E,K,dtype", [
    (37, 20, 17, 5, 3, torch.float32), (29, 33, 40, 3, 2, torch.float32), (37, 20, 17, 5, 3, torch.bfloat16)])
def test_swiglu_down_backward_matches_reference(T, D, H, E, K, dtype):
    experts, weights = routing_case(T, E, K)
    r = moe_routing(experts, E, 16)
    w_sorted = weights.reshape(-1)[r.sorted_assign.long()].float().contiguous()
    dy, down = rand(T, D, dtype=dtype), rand(E, D, H, dtype=dtype, scale=H ** -0.5)
    gu = gate_up_swiglu_reference(rand(T, D, dtype=dtype), rand(E, 2 * H, D, dtype=dtype, scale=D ** -0.5), r)[1]
    dgu, h, dw = swiglu_down_backward(dy, down, gu, w_sorted, r, tiles=SMALL)
    dgu_ref, h_ref, dw_ref = swiglu_down_backward_reference(dy, down, gu, w_sorted, r)
    torch.testing.assert_close(h, h_ref, **tol(dtype))
    torch.testing.assert_close(dgu, dgu_ref, **tol(dtype))
    torch.testing.assert_close(dw, dw_ref, **(dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else tol(dtype)))
    assert bool((dw[r.sorted_expert == E] == 0).all())


@pytest.mark.parametrize("T,Ma,Nb,E,K,dtype", [
    (37, 20, 33, 5, 3, torch.float32), (50, 9, 7, 6, 4, torch.float32), (50, 9, 7, 6, 4, torch.bfloat16)])
def test_group_weight_grad_matches_reference(T, Ma, Nb, E, K, dtype):
    experts, weights = routing_case(T, E, K)
    r = moe_routing(experts, E, 16)
    N = T * K
    scale = weights.reshape(-1)[r.sorted_assign.long()].float().contiguous()
    for a_grouped, b_grouped, with_scale in [(True, False, False), (False, True, True), (True, True, True)]:
        a = rand(N if a_grouped else T, Ma, dtype=dtype)
        b = rand(N if b_grouped else T, Nb, dtype=dtype)
        s = scale if with_scale else None
        got = group_weight_grad(a, b, r, a_grouped=a_grouped, b_grouped=b_grouped, scale=s, tiles=SMALL_W)
        ref = group_weight_grad_reference(a, b, r, a_grouped=a_grouped, b_grouped=b_grouped, scale=s)
        assert got.shape == (E, Ma, Nb)
        tolerance = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-1, rtol=3e-2)
        torch.testing.assert_close(got, ref, **tolerance)
        assert bool((got[0] == 0).all()), "an expert without tokens gets a zero gradient"


def test_kernels_with_upper_bound_block_map():
    """The CUDA-style map (no host sync: unused blocks marked -1) gives the same result."""
    experts, weights = routing_case(45, 6, 3)
    x, w = rand(45, 20), rand(6, 24, 20)
    exact = moe_routing(experts, 6, 16, exact_blocks=True)
    bound = moe_routing(experts, 6, 16, exact_blocks=False)
    assert bound.max_blocks > exact.max_blocks
    a = grouped_gemm(x, w, exact, x_grouped=False, y_grouped=False, tiles=SMALL)
    b = grouped_gemm(x, w, bound, x_grouped=False, y_grouped=False, tiles=SMALL)
    assert torch.equal(a, b)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error path")
def test_launch_on_cpu_without_interpreter_fails_with_a_clear_error(monkeypatch):
    experts, weights = routing_case(10, 3, 2)
    r = moe_routing(experts, 3, 16)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "TRITON_INTERPRET=1" in runnable_reason() and "experts.name=sorted" in runnable_reason()
    with pytest.raises(RuntimeError, match=r"Triton MoE kernels run on CUDA \(got device cpu\).*TRITON_INTERPRET=1"):
        grouped_gemm(rand(10, 8), rand(3, 6, 8), r, x_grouped=False, y_grouped=True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert runnable_reason() is None and runnable_reason(torch.device("cpu")) is None
