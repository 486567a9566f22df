"""`sorted_fused` (moe/experts/sorted_fused.py): the sorted scheme as one autograd Function.

Forward/gradient equality with the loop reference on odd shapes is covered for every registered
dispatch by tests/experts/test_dispatch.py; here: both GEMM paths (torch grouped_mm and the
per-expert loop), pure bf16 and bf16 autocast, and the smaller set of saved activations."""

import pytest
import torch

import moe.experts.sorted_fused as sf
from moe.experts import EXPERT_DISPATCH


def _case(T, D, H, E, K, drop=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(T, E, generator=g)
    scores[:, 0] = -1e9  # expert 0 gets no tokens
    experts = scores.topk(K, dim=-1).indices
    weights = torch.rand(T, K, generator=g)
    if drop:
        mask = torch.rand(T, K, generator=g) < 0.3
        experts, weights = experts.masked_fill(mask, E), weights.masked_fill(mask, 0.0)
    x = torch.randn(T, D, generator=g).to(dtype)
    gate_up = (torch.randn(E, 2 * H, D, generator=g) / D ** 0.5).to(dtype)
    down = (torch.randn(E, D, H, generator=g) / H ** 0.5).to(dtype)
    return x, experts, weights, gate_up, down


def _run(fn, inputs, gy=None):
    leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    y = fn(*leaves)
    gy = torch.randn_like(y) if gy is None else gy
    y.backward(gy)
    return y, gy, [leaves[i].grad for i in (0, 2, 3, 4)]


@pytest.mark.parametrize("native", [True, False])
def test_grouped_mm_and_loop_paths_equal_the_loop_reference(monkeypatch, native):
    if not native:
        monkeypatch.setattr(sf, "native_grouped_mm_ok", lambda a, b: False)
        monkeypatch.setattr(sf, "_wgrad_ok", lambda a, b: False)
    inputs = _case(48, 32, 64, 6, 3)  # 16-byte aligned rows: the native grouped_mm path applies
    y, gy, grads = _run(EXPERT_DISPATCH.get("sorted_fused"), inputs)
    y_ref, _, grads_ref = _run(EXPERT_DISPATCH.get("loop"), inputs, gy)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4)
    assert bool((grads[2][0] == 0).all()), "an expert without tokens gets a zero gradient"


def test_pure_bf16_close_to_fp32():
    inputs = _case(40, 32, 48, 4, 2, dtype=torch.bfloat16)
    y, gy, grads = _run(EXPERT_DISPATCH.get("sorted_fused"), inputs)
    up = [t.float() if t.is_floating_point() else t for t in inputs]
    y_ref, _, grads_ref = _run(EXPERT_DISPATCH.get("loop"), up, gy.float())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), y_ref, atol=3e-2, rtol=3e-2)
    for g, g_ref in zip(grads, grads_ref):
        assert float((g.float() - g_ref).abs().max() / g_ref.abs().max()) < 3e-2


def test_bf16_autocast_keeps_the_residual_dtype():
    x, e, w, gu, d = _case(40, 32, 32, 4, 2, drop=False)
    y32 = EXPERT_DISPATCH.get("sorted_fused")(x, e, w, gu, d)
    gu.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y16 = EXPERT_DISPATCH.get("sorted_fused")(x, e, w, gu, d)
    assert y16.dtype == torch.float32
    torch.testing.assert_close(y16, y32.detach(), atol=5e-2, rtol=5e-2)
    y16.sum().backward()
    assert gu.grad.dtype == torch.float32


def _saved_bytes(fn, inputs):
    leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    own = {t.untyped_storage().data_ptr() for t in leaves}
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*leaves)
    return sum(b for k, b in seen.items() if k not in own)


def test_saves_less_for_backward_than_sorted():
    inputs = _case(256, 64, 128, 8, 2, drop=False)
    fused = _saved_bytes(EXPERT_DISPATCH.get("sorted_fused"), inputs)
    plain = _saved_bytes(EXPERT_DISPATCH.get("sorted"), inputs)
    assert fused < 0.6 * plain, (fused, plain)
