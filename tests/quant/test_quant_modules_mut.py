"""moe/quant/modules.py, the mutation run's additions (docs/results/mutation/run6_mutQ): which buffers
a quantized module stores and hands its scheme, that `.to()` moves them but never casts them, the
AWQ input scale, the biases and the activations of `QuantExperts` against a per-assignment
reference, bf16 inputs end to end, and the module's printed summary. No fixtures (the driver calls
these functions directly)."""

import pytest
import torch
import torch.nn.functional as F

from kernels.runtime import interpreting
from moe.experts.biased import clamped_swiglu
from moe.quant import QuantExperts, QuantLinear, get_scheme, quantize_activation
from moe.quant.dispatch import kernel_mode

# as tests/quant/test_dispatch.py: the compiled kernels on a GPU, else the interpreter on CPU (conftest.py)
DEVICE = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"


def _experts(name="int8", *, biases=True, in_scale=True, activation="swiglu", seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    E, D, H = 3, 16, 8
    gate_up, down = torch.randn(E, 2 * H, D, generator=g) * 0.3, torch.randn(E, D, H, generator=g) * 0.3
    args = {}
    if biases:
        args = {"gate_up_bias_E2H": torch.randn(E, 2 * H, generator=g), "down_bias_ED": torch.randn(E, D, generator=g)}
    s = torch.rand(E, D, generator=g) + 0.5 if in_scale else None
    return QuantExperts(get_scheme(name, 16), gate_up, down, s, activation=activation, **args, **kw), gate_up, down


def _reference(mod, x, experts, weights):
    """sum over kept assignments of w * expert_e(x): the module's math written out per assignment."""
    y = torch.zeros(x.shape[0], mod.d_model, dtype=torch.float32)
    for t in range(x.shape[0]):
        for k in range(experts.shape[1]):
            e = int(experts[t, k])
            if not 0 <= e < mod.n_experts:
                continue
            gu, dn = mod.expert_weights(e)
            xe = x[t:t + 1].float()
            if mod.in_scale is not None:
                xe = xe * mod.in_scale[e]
            if mod.scheme.act_fp8:
                xe = quantize_activation(xe)
            h = xe @ gu.T
            if mod.gate_up_proj_bias is not None:
                h = h + mod.gate_up_proj_bias[e]
            gate, up = h.chunk(2, dim=-1)
            if mod.activation == "clamped_swiglu":
                h = clamped_swiglu(gate, up, mod.alpha, mod.limit)
            else:
                h = F.silu(gate) * up
            if mod.scheme.act_fp8:
                h = quantize_activation(h)
            out = h @ dn.T
            if mod.down_proj_bias is not None:
                out = out + mod.down_proj_bias[e]
            y[t] += float(weights[t, k]) * out[0]
    return y


def test_quant_linear_stores_the_schemes_tensors_under_its_prefix():
    scheme = get_scheme("int4", 16)
    w = torch.randn(6, 40)
    q = QuantLinear(scheme, w, None)
    stored = scheme.quantize(w)
    assert set(q._buffers) == {f"w_{k}" for k in stored} | {"bias", "in_scale"}
    got = q._get("w_")
    assert set(got) == set(stored)
    for k in stored:
        assert torch.equal(got[k], stored[k]), k
    row = q._get("w_", 2)
    for k in stored:
        assert torch.equal(row[k], stored[k][2]), k
    assert (q.out_features, q.in_features) == (6, 40)
    assert q.dequantized_weight().dtype == torch.float32
    torch.testing.assert_close(q.dequantized_weight(), scheme.dequantize(stored, 40, torch.float32), rtol=0, atol=0)
    assert q.dequantized_weight(torch.bfloat16).dtype == torch.bfloat16


def test_quant_experts_hand_the_scheme_only_its_own_tensors_never_the_biases():
    mod, gate_up, down = _experts("int8")
    scheme = mod.scheme
    for prefix, w in (("gate_up_", gate_up), ("down_", down)):
        got = mod._get(prefix)
        want = scheme.quantize(w)
        assert set(got) == set(want), prefix
        for k in want:
            assert torch.equal(got[k], want[k]), (prefix, k)
    assert (mod.n_experts, mod.d_model, mod.hidden) == (3, 16, 8)
    assert isinstance(mod.hidden, int)
    gu, dn = mod.expert_weights(1)
    assert gu.dtype == dn.dtype == torch.float32
    assert gu.shape == (16, 16) and dn.shape == (16, 8)
    one = {k: v[1] for k, v in scheme.quantize(gate_up).items()}
    torch.testing.assert_close(gu, scheme.dequantize(one, 16, torch.float32), rtol=0, atol=0)


def test_biases_and_scales_are_fp32_copies_detached_from_their_source():
    lin = torch.nn.Linear(32, 8)
    bias = lin.bias.detach().to(torch.bfloat16).clone()
    scale = (torch.rand(32) + 0.5).to(torch.bfloat16)
    q = QuantLinear(get_scheme("int8"), lin.weight, bias, scale)
    assert q.bias.dtype == q.in_scale.dtype == torch.float32
    b0, s0 = q.bias.clone(), q.in_scale.clone()
    with torch.no_grad():
        bias.add_(1.0)
        scale.add_(1.0)
    assert torch.equal(q.bias, b0) and torch.equal(q.in_scale, s0)
    # the source layer's parameters need grad; the module's stored tensors do not follow them
    q2 = QuantLinear(get_scheme("int8"), lin.weight, lin.bias, torch.rand(32, requires_grad=True))
    assert not q2.bias.requires_grad and not q2.in_scale.requires_grad
    assert not any(b.requires_grad for b in q2._buffers.values() if b is not None)
    mod, _, _ = _experts("int8")
    src = torch.randn(3, 16, requires_grad=True)
    m2 = QuantExperts(get_scheme("int8"), torch.randn(3, 16, 16), torch.randn(3, 16, 8), src.to(torch.bfloat16),
                      gate_up_bias_E2H=torch.randn(3, 16).to(torch.bfloat16), down_bias_ED=src)
    for name in ("in_scale", "gate_up_proj_bias", "down_proj_bias"):
        b = getattr(m2, name)
        assert b.dtype == torch.float32 and not b.requires_grad, name
    with torch.no_grad():
        src.add_(1.0)
    assert not torch.equal(m2.down_proj_bias, src.detach())


def test_to_returns_the_module_and_keeps_the_device_it_was_moved_to():
    mod, _, _ = _experts("int4")
    dtypes = {k: v.dtype for k, v in mod._buffers.items() if v is not None}
    assert mod.to(torch.float64) is mod
    assert {k: v.dtype for k, v in mod._buffers.items() if v is not None} == dtypes
    mod.to("meta")
    assert all(v.device.type == "meta" for v in mod._buffers.values() if v is not None)
    mod.to(torch.bfloat16)  # a dtype-only move keeps the device: the buffers stay on meta
    assert all(v.device.type == "meta" for v in mod._buffers.values() if v is not None)
    assert {k: v.dtype for k, v in mod._buffers.items() if v is not None} == dtypes
    q = QuantLinear(get_scheme("int8"), torch.randn(4, 8), None)
    assert q.to("meta") is q and q.bias is None and q.w_qweight.device.type == "meta"


def test_quantized_bytes_counts_every_stored_tensor():
    q = QuantLinear(get_scheme("int4", 16), torch.randn(6, 40), None)
    want = sum(b.numel() * b.element_size() for b in q._buffers.values() if b is not None)
    assert q.quantized_bytes() == want
    assert want == q.w_qweight.numel() * q.w_qweight.element_size() + sum(
        v.numel() * v.element_size() for k, v in q._buffers.items() if v is not None and k != "w_qweight")
    q8 = QuantLinear(get_scheme("int8"), torch.randn(4, 10), torch.randn(4))
    # int8 codes [4, 10] (1 byte), fp32 scales [4] (4 bytes each), fp32 bias [4]
    assert q8.quantized_bytes() == 40 + 4 * 4 + 4 * 4


def test_quant_linear_applies_the_input_scale_and_follows_bf16_inputs():
    lin = torch.nn.Linear(32, 8)
    scale = torch.rand(32) + 0.5
    q = QuantLinear(get_scheme("int8"), lin.weight, lin.bias, scale)
    x = torch.randn(5, 32)
    w = q.dequantized_weight()
    torch.testing.assert_close(q(x), F.linear(x * scale, w, lin.bias.detach()), rtol=1e-5, atol=1e-5)
    xb = x.to(torch.bfloat16)
    y = q(xb)
    assert y.dtype == torch.bfloat16
    ref = F.linear(xb * scale.to(torch.bfloat16), q.dequantized_weight(torch.bfloat16), lin.bias.detach().to(torch.bfloat16))
    torch.testing.assert_close(y, ref, rtol=0, atol=0)


def test_extra_repr():
    q = QuantLinear(get_scheme("int8"), torch.randn(4, 10), None)
    assert q.extra_repr() == "in_features=10, out_features=4, scheme=int8"
    mod, _, _ = _experts("int4", activation="clamped_swiglu")
    assert mod.extra_repr() == ("n_experts=3, d_model=16, hidden=8, scheme=int4, activation=clamped_swiglu, "
                                "bias=True")
    mod, _, _ = _experts("int8", biases=False)
    assert mod.extra_repr().endswith("scheme=int8, activation=swiglu, bias=False")


def test_plain_swiglu_and_the_activations():
    assert _experts(biases=False)[0].plain_swiglu
    assert not _experts(biases=True)[0].plain_swiglu
    assert not _experts(biases=False, activation="clamped_swiglu")[0].plain_swiglu
    only_up = QuantExperts(get_scheme("int8"), torch.randn(2, 8, 4), torch.randn(2, 4, 4),
                           gate_up_bias_E2H=torch.randn(2, 8))
    only_down = QuantExperts(get_scheme("int8"), torch.randn(2, 8, 4), torch.randn(2, 4, 4),
                             down_bias_ED=torch.randn(2, 4))
    assert not only_up.plain_swiglu and not only_down.plain_swiglu
    t = torch.linspace(-20, 20, 2 * 40).reshape(2, 40)  # beyond the clamp limit 7 on both sides
    gate, up = t.chunk(2, dim=-1)
    clamped = _experts(biases=False, activation="clamped_swiglu")[0]
    assert (clamped.alpha, clamped.limit) == (1.702, 7.0)
    torch.testing.assert_close(clamped.act(t), clamped_swiglu(gate, up, 1.702, 7.0), rtol=0, atol=0)
    plain = _experts(biases=False)[0]
    torch.testing.assert_close(plain.act(t), F.silu(gate) * up, rtol=0, atol=0)
    custom = _experts(biases=False, activation="clamped_swiglu", alpha=1.0, limit=3.0)[0]
    torch.testing.assert_close(custom.act(t), clamped_swiglu(gate, up, 1.0, 3.0), rtol=0, atol=0)


@pytest.mark.parametrize("name, activation, biases, in_scale", [
    ("int8", "swiglu", True, True), ("int8", "clamped_swiglu", True, False), ("int4", "swiglu", False, True),
    ("fp8", "clamped_swiglu", True, True), ("fp8", "swiglu", False, False)])
def test_quant_experts_forward_equals_the_per_assignment_reference(name, activation, biases, in_scale):
    mod = _experts(name, biases=biases, in_scale=in_scale, activation=activation, seed=1)[0]
    g = torch.Generator().manual_seed(2)
    T, K = 7, 2
    x = torch.randn(T, 16, generator=g) * 3
    experts = torch.randint(0, 4, (T, K), generator=g)  # id 3 = E: a dropped assignment
    experts[0] = torch.tensor([3, 1])
    weights = torch.rand(T, K, generator=g)
    torch.testing.assert_close(mod(x, experts, weights), _reference(mod, x, experts, weights), rtol=1e-5, atol=1e-5)


def test_quant_experts_follow_bf16_inputs_with_biases_and_scales():
    mod = _experts("int8", activation="clamped_swiglu")[0]
    x = torch.randn(5, 16).to(torch.bfloat16)
    experts = torch.tensor([[0, 1], [2, 0], [1, 2], [0, 3], [2, 2]])
    weights = torch.rand(5, 2).to(torch.bfloat16)
    y = mod(x, experts, weights)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), _reference(mod, x.float(), experts, weights.float()), rtol=0.05, atol=0.05)


def test_the_default_activation_is_plain_swiglu():
    mod = QuantExperts(get_scheme("int8"), torch.randn(2, 8, 4), torch.randn(2, 4, 4))
    assert mod.activation == "swiglu" and mod.plain_swiglu
    assert (mod.alpha, mod.limit) == (1.702, 7.0)
    t = torch.randn(3, 8)
    gate, up = t.chunk(2, dim=-1)
    torch.testing.assert_close(mod.act(t), F.silu(gate) * up, rtol=0, atol=0)


@pytest.mark.parametrize("activation", ["swiglu", "clamped_swiglu"])
def test_biased_experts_on_the_kernels_keep_their_biases_and_activation(activation):
    # GPT-OSS's experts (biases, clamped SwiGLU) on the gather-GEMM equal the dequantise loop
    mod = _experts("int8", activation=activation, in_scale=False, seed=3)[0].to(DEVICE)
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(9, 16, generator=g) * 3).to(DEVICE)
    experts = torch.randint(0, 4, (9, 2), generator=g).to(DEVICE)  # id 3 = E: dropped
    weights = torch.rand(9, 2, generator=g).to(DEVICE)
    with torch.no_grad():
        with kernel_mode("dequantize"):
            ref = mod(x, experts, weights)
        with kernel_mode("kernels"):
            got = mod(x, experts, weights)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
