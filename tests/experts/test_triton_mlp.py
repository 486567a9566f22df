"""`moe/experts/triton_mlp.py`: `moe_mlp`, the autograd Function over the Triton MoE kernels,
against the `loop` dispatch (forward and every gradient), in the Triton interpreter on CPU.
Inputs: tests/kernels/moe_gemm_cases.py (odd sizes, empty experts, dropped assignments)."""

import pytest
import torch

from kernels.moe_gemm import moe_mlp_reference
from moe.experts import EXPERT_DISPATCH
from moe.experts.triton_mlp import moe_mlp
from tests.kernels.moe_gemm.cases import SMALL, fwd_bwd, mlp_case, rand, routing_case, upcast

pytest.importorskip("triton")

MLP_CASES = [  # T, D, H, E, K, drop, block_m (16: 16-wide tiles everywhere; None: the default config)
    (1, 8, 4, 2, 1, False, 16), (23, 20, 17, 5, 1, True, None), (37, 16, 24, 8, 3, True, 16),
    (50, 7, 5, 6, 4, True, None), (29, 33, 17, 3, 2, False, 16), (45, 24, 40, 4, 2, True, None),
]


@pytest.mark.parametrize("T,D,H,E,K,drop,block_m", MLP_CASES)
def test_moe_mlp_fp32_equals_loop_forward_and_grads(T, D, H, E, K, drop, block_m):
    inputs = mlp_case(T, D, H, E, K, drop, torch.float32)
    tiles = SMALL if block_m == 16 else None
    y, gy, grads = fwd_bwd(lambda *a: moe_mlp(*a, block_m=block_m, tiles=tiles), inputs)
    y_ref, _, grads_ref = fwd_bwd(EXPERT_DISPATCH.get("loop"), inputs, gy)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    for name, g, g_ref in zip(("x", "router weights", "gate_up", "down"), grads, grads_ref):
        torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4, msg=lambda m: f"d{name}: {m}")
    if drop:
        dropped = inputs[1] == E
        assert bool((grads[1][dropped] == 0).all()), "dropped slots get no router-weight gradient"


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)])
@pytest.mark.parametrize("T,D,H,E,K,drop", [(37, 16, 24, 8, 3, True), (50, 20, 17, 4, 2, False)])
def test_moe_mlp_low_precision_close_to_fp32_loop(T, D, H, E, K, drop, dtype):
    inputs = mlp_case(T, D, H, E, K, drop, dtype)
    y, gy, grads = fwd_bwd(lambda *a: moe_mlp(*a, block_m=16), inputs)
    assert y.dtype == dtype and all(g.dtype == t.dtype for g, t in zip(grads, [inputs[i] for i in (0, 2, 3, 4)]))
    y_ref, _, grads_ref = fwd_bwd(EXPERT_DISPATCH.get("loop"), upcast(inputs), gy.float())
    torch.testing.assert_close(y.float(), y_ref, atol=3e-2, rtol=3e-2)
    for name, g, g_ref in zip(("x", "router weights", "gate_up", "down"), grads, grads_ref):
        err = (g.float() - g_ref).abs().max() / g_ref.abs().max().clamp_min(1e-6)
        assert err < 3e-2, f"d{name}: max error {err:.3g} of the largest entry"


@pytest.mark.slow
def test_moe_mlp_larger_fp32():
    inputs = mlp_case(80, 40, 48, 12, 3, True, torch.float32)
    y, gy, grads = fwd_bwd(lambda *a: moe_mlp(*a, block_m=32, tiles=dict(BLOCK_N=32, BLOCK_K=32)), inputs)
    y_ref, _, grads_ref = fwd_bwd(moe_mlp_reference, inputs, gy)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4)


def test_moe_mlp_no_tokens():
    inputs = mlp_case(0, 8, 4, 3, 2, False, torch.float32)
    y, _, grads = fwd_bwd(moe_mlp, inputs)
    assert y.shape == (0, 8) and grads[2].abs().sum() == 0


def test_moe_mlp_all_dropped():
    x, experts, weights, gate_up, down = mlp_case(9, 8, 4, 3, 2, False, torch.float32)
    inputs = (x, torch.full_like(experts, 3), weights, gate_up, down)
    y, _, grads = fwd_bwd(moe_mlp, inputs)
    assert bool((y == 0).all()) and all(bool((g == 0).all()) for g in grads)


def test_moe_mlp_rejects_mismatched_shapes_with_clear_errors():
    experts, weights = routing_case(10, 3, 2)
    x = rand(10, 8)
    with pytest.raises(ValueError, match=r"gate_up \[E, 2H, D\] and down \[E, D, H\]"):
        moe_mlp(x, experts, weights, rand(3, 6, 8), rand(3, 8, 4))
    with pytest.raises(ValueError, match=r"must both be \[tokens=10, top_k\]"):
        moe_mlp(x, experts[:9], weights[:9], rand(3, 8, 8), rand(3, 8, 4))
    with pytest.raises(ValueError, match="router weights must be floating point"):
        moe_mlp(x, experts, experts, rand(3, 8, 8), rand(3, 8, 4))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error path")
def test_moe_mlp_on_cpu_without_interpreter_fails_with_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    inputs = mlp_case(5, 8, 4, 2, 1, False, torch.float32)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        moe_mlp(*inputs)
