"""`moe/experts/triton.py`: the `triton` expert dispatch (registered, equal to the `loop`
reference, as an `SwiGLUExperts` module, under autocast, and refused clearly where it cannot run),
in the Triton interpreter on CPU."""

import pytest
import torch

from moe.errors import ConfigError
from moe.experts import EXPERT_DISPATCH, SwiGLUExperts
from tests.kernels.moe_gemm.cases import DEVICE, fwd_bwd, mlp_case, rand, routing_case

pytest.importorskip("triton")


def test_triton_dispatch_is_registered_and_matches_loop():
    inputs = mlp_case(37, 16, 24, 8, 3, True, torch.float32)
    y, gy, grads = fwd_bwd(EXPERT_DISPATCH.get("triton"), inputs)
    y_ref, _, grads_ref = fwd_bwd(EXPERT_DISPATCH.get("loop"), inputs, gy)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4)


def test_swiglu_experts_module_with_triton_dispatch():
    E, D, H = 4, 12, 20
    mods = {}
    for name in ("triton", "loop"):
        torch.manual_seed(1)
        mods[name] = SwiGLUExperts(E, D, H, dispatch=name).to(DEVICE)
        torch.nn.init.normal_(mods[name].gate_up_proj, std=0.2)
        torch.nn.init.normal_(mods[name].down_proj, std=0.2)
    x = rand(30, D)
    experts, weights = routing_case(30, E, 2)
    out = {n: m(x, experts, weights) for n, m in mods.items()}
    torch.testing.assert_close(out["triton"], out["loop"], atol=1e-5, rtol=1e-5)
    for n in out:
        out[n].square().sum().backward()
    for p in ("gate_up_proj", "down_proj"):
        torch.testing.assert_close(getattr(mods["triton"], p).grad, getattr(mods["loop"], p).grad, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU autocast")
def test_triton_dispatch_bf16_autocast_close_to_fp32():
    x, e, w, gu, d = mlp_case(40, 32, 32, 4, 2, False, torch.float32)
    gu.requires_grad_(True)
    y32 = EXPERT_DISPATCH.get("triton")(x, e, w, gu, d)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y16 = EXPERT_DISPATCH.get("triton")(x, e, w, gu, d)
    assert y16.dtype == torch.float32  # output keeps the residual stream's dtype
    torch.testing.assert_close(y16, y32, atol=5e-2, rtol=5e-2)
    y16.sum().backward()
    assert gu.grad.dtype == torch.float32 and torch.isfinite(gu.grad).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error path")
def test_cpu_without_interpreter_fails_with_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    inputs = mlp_case(5, 8, 4, 2, 1, False, torch.float32)
    # Building a model looks the variant up with `get`, which refuses at start-up...
    with pytest.raises(ConfigError, match=r"experts.name='triton'.*TRITON_INTERPRET=1"):
        EXPERT_DISPATCH.get("triton")
    # ...and a direct call still fails clearly instead of launching.
    fn = EXPERT_DISPATCH.lookup("triton")
    with pytest.raises(RuntimeError, match=r"CUDA.*TRITON_INTERPRET=1"):
        fn(*inputs)
    assert "TRITON_INTERPRET=1" in EXPERT_DISPATCH.unavailable_reason("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fn.unavailable_reason() is None
    EXPERT_DISPATCH.get("triton")
