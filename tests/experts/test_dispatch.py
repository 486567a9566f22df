"""Every dispatch fast path equals the per-expert loop reference, forward and gradients,
on random odd-sized inputs (experts with no tokens, dropped assignments, top_k 1..4)."""

import os

import pytest
import torch

if not torch.cuda.is_available():  # the `triton` dispatch runs (slowly) in Triton's interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

from moe.experts import EXPERT_DISPATCH
from moe.experts.grouped_mm import grouped_mm, grouped_mm_loop


def per_token_reference(x, experts, weights, gate_up, down):
    """The dumbest possible MoE: every token, every slot, one expert at a time."""
    y = torch.zeros_like(x)
    H = down.shape[-1]
    for t in range(x.shape[0]):
        for s in range(experts.shape[1]):
            e = int(experts[t, s])
            if e >= gate_up.shape[0]:
                continue
            h = gate_up[e] @ x[t]
            y[t] += weights[t, s] * (down[e] @ (torch.nn.functional.silu(h[:H]) * h[H:]))
    return y


def _case(T, D, H, E, K, drop=False, skip_expert=True, dtype=torch.float32):
    x = torch.randn(T, D, dtype=dtype)
    scores = torch.randn(T, E)
    if skip_expert and E > K:
        scores[:, 0] = -1e9  # expert 0 gets no tokens at all
    experts = scores.topk(K, dim=-1).indices
    weights = torch.rand(T, K)
    if drop:
        mask = torch.rand(T, K) < 0.3
        experts = experts.masked_fill(mask, E)
        weights = weights.masked_fill(mask, 0.0)
    gate_up = torch.randn(E, 2 * H, D, dtype=dtype) / D ** 0.5
    down = torch.randn(E, D, H, dtype=dtype) / H ** 0.5
    return x, experts, weights, gate_up, down


def _fast_paths():
    """Every registered dispatch but the reference; one that cannot run here says why and is skipped."""
    out = []
    for n in EXPERT_DISPATCH:
        if n == "loop":
            continue
        why = EXPERT_DISPATCH.unavailable_reason(n)
        out.append(pytest.param(n, marks=pytest.mark.skip(reason=why)) if why else n)
    return out


@pytest.mark.parametrize("name", _fast_paths())
@pytest.mark.parametrize("T,D,H,E,K,drop", [
    (1, 8, 4, 2, 1, False), (13, 12, 20, 5, 2, False), (37, 16, 24, 8, 3, True),
    (50, 7, 5, 6, 4, True), (64, 32, 64, 8, 2, False), (29, 33, 17, 3, 3, False),
])
def test_dispatch_equals_loop_reference(name, T, D, H, E, K, drop):
    fast = EXPERT_DISPATCH.get(name)
    ref = EXPERT_DISPATCH.get("loop")
    inputs = _case(T, D, H, E, K, drop)
    a = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    b = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    ya, yb = fast(*a), ref(*b)
    torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    for i in (0, 2, 3, 4):
        torch.testing.assert_close(a[i].grad, b[i].grad, atol=1e-4, rtol=1e-4)


def test_loop_equals_per_token_reference():
    inputs = _case(11, 6, 5, 4, 2, drop=True)
    torch.testing.assert_close(EXPERT_DISPATCH.get("loop")(*inputs), per_token_reference(*inputs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("N,D,H,E", [(20, 16, 8, 3), (17, 5, 3, 4), (0, 16, 16, 2)])
def test_grouped_mm_matches_loop(N, D, H, E):
    x = torch.randn(N, D)
    w = torch.randn(E, D, H)
    cuts = sorted(torch.randint(0, N + 1, (E - 1,)).tolist()) + [N]
    offs = torch.tensor(cuts, dtype=torch.int32)
    torch.testing.assert_close(grouped_mm(x, w, offs), grouped_mm_loop(x, w, offs), atol=1e-5, rtol=1e-5)


def test_sorted_dispatch_bf16_close_to_fp32():
    x, e, w, gu, d = _case(40, 32, 32, 4, 2)
    y32 = EXPERT_DISPATCH.get("sorted")(x, e, w, gu, d)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y16 = EXPERT_DISPATCH.get("sorted")(x, e, w, gu, d)
    assert y16.dtype == torch.float32  # output keeps the residual stream's dtype
    torch.testing.assert_close(y16, y32, atol=5e-2, rtol=5e-2)
