"""moe/quant/modules.py: the quantized modules compute with exactly the dequantised weights,
the grouped experts match the `loop` dispatch, and `model.to(dtype)` leaves the stored tensors alone."""

import pytest
import torch
import torch.nn.functional as F

from moe.experts.loop import loop_dispatch
from moe.quant import QuantExperts, QuantLinear, get_scheme, quantize_activation


@pytest.mark.parametrize("name", ["int8", "int4", "fp8_weight", "fp8"])
def test_quant_linear_is_linear_on_dequantised_weights(name):
    lin = torch.nn.Linear(70, 33, bias=True)
    scheme = get_scheme(name, 32)
    q = QuantLinear(scheme, lin.weight, lin.bias)
    x = torch.randn(2, 5, 70)
    w = scheme.fake_quantize(lin.weight.detach())
    x_in = quantize_activation(x) if scheme.act_fp8 else x
    torch.testing.assert_close(q(x), F.linear(x_in, w, lin.bias.detach()), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        rel = float((q(x) - lin(x)).norm() / lin(x).norm())
    assert rel < {"int8": 0.01, "int4": 0.15, "fp8_weight": 0.06, "fp8": 0.08}[name]


@pytest.mark.parametrize("name", ["int4", "fp8"])
def test_quant_experts_match_loop_dispatch_on_dequantised_weights(name):
    E, D, H, T, K = 5, 48, 40, 23, 2
    gate_up, down = torch.randn(E, 2 * H, D) * 0.1, torch.randn(E, D, H) * 0.1
    scheme = get_scheme(name, 16)
    mod = QuantExperts(scheme, gate_up, down)
    x = torch.randn(T, D)
    experts = torch.randint(0, E + 1, (T, K))  # id E: a dropped assignment
    weights = torch.rand(T, K)
    y = mod(x, experts, weights)
    if not scheme.act_fp8:
        ref = loop_dispatch(x, experts, weights, scheme.fake_quantize(gate_up), scheme.fake_quantize(down))
        torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    full = loop_dispatch(x, experts, weights, gate_up, down)
    assert float((y - full).norm() / full.norm()) < 0.15
    assert mod.quantized_bytes() < (gate_up.numel() + down.numel()) * 4 / 3  # stored, not float


def test_to_dtype_moves_but_never_casts_stored_tensors():
    lin = torch.nn.Linear(64, 16)
    q = QuantLinear(get_scheme("int4", 32), lin.weight, lin.bias)
    before = {k: v.clone() for k, v in q.state_dict().items()}
    q.to(torch.bfloat16)
    for k, v in q.state_dict().items():
        assert v.dtype == before[k].dtype and torch.equal(v, before[k]), k
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    assert q(x).dtype == torch.bfloat16
