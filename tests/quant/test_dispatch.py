"""moe/quant/dispatch.py: with the Triton kernels forced on (`kernel_mode("kernels")`, the kernels
running in the interpreter on CPU), the quantized modules compute what the dequantise-then-matmul
path computes, for every scheme the kernels read, AWQ input scales and dropped assignments
included; the kernels' layout is the one `moe.quant`'s schemes store; and the mode switch is safe."""

import pytest
import torch

from kernels.quant_gemm import dequantize_reference
from kernels.runtime import interpreting
from moe.errors import ConfigError
from moe.quant import QuantExperts, QuantLinear, get_scheme
from moe.quant.dispatch import kernel_mode, quant_weight, set_kernel_mode, use_kernels

SCHEMES = ["int8", "int4", "awq", "fp8_weight", "fp8"]
# on a GPU (TRITON_INTERPRET unset) the compiled kernels on CUDA tensors; else the interpreter on CPU
DEVICE = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"


@pytest.mark.parametrize("name", SCHEMES)
def test_kernels_read_the_layout_the_schemes_store(name):
    scheme = get_scheme(name, 16)
    w = torch.randn(3, 7, 37)  # an expert stack with a short last int4 group
    stored = scheme.quantize(w)
    got = dequantize_reference(quant_weight(scheme, stored, 37))
    torch.testing.assert_close(got, scheme.dequantize(stored, 37, torch.float32), rtol=0, atol=0)


@pytest.mark.parametrize("name", SCHEMES)
def test_quant_linear_on_the_kernel_equals_the_dequantise_path(name):
    lin = torch.nn.Linear(45, 21, bias=name != "int8")
    in_scale = torch.rand(45) + 0.5 if name == "awq" else None
    q = QuantLinear(get_scheme(name, 16), lin.weight, lin.bias, in_scale).to(DEVICE)
    x = torch.randn(2, 3, 45, device=DEVICE)
    with torch.no_grad():
        with kernel_mode("dequantize"):
            ref = q(x)
        with kernel_mode("kernels"):
            got = q(x)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["int8", "int4", "awq", "fp8"])
def test_quant_experts_on_the_gather_gemm_equal_the_loop(name):
    E, D, H, T, K = 4, 40, 24, 13, 2
    gate_up, down = torch.randn(E, 2 * H, D) * 0.1, torch.randn(E, D, H) * 0.1
    in_scale = torch.rand(E, D) + 0.5 if name == "awq" else None
    mod = QuantExperts(get_scheme(name, 16), gate_up, down, in_scale).to(DEVICE)
    x = torch.randn(T, D, device=DEVICE)
    experts = torch.randint(0, E + 1, (T, K), device=DEVICE)  # id E: a dropped assignment
    experts[0] = E  # a token with every assignment dropped
    weights = torch.rand(T, K, device=DEVICE)
    with torch.no_grad():
        with kernel_mode("dequantize"):
            ref = mod(x, experts, weights)
        with kernel_mode("kernels"):
            got = mod(x, experts, weights)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert (got[0] == 0).all()


@pytest.mark.parametrize("experts", [False, True])
def test_fp8_without_fp8_tensor_cores_falls_back_to_decoded_weights(experts, monkeypatch):
    # sm_80: no FP8 dot; the activations are quantize-dequantised and the E4M3 weights decoded in the kernel
    from moe.quant import dispatch

    monkeypatch.setattr(dispatch, "fp8_tensor_cores", lambda device: False)
    scheme = get_scheme("fp8")
    if experts:
        mod = QuantExperts(scheme, torch.randn(3, 32, 24) * 0.1, torch.randn(3, 24, 16) * 0.1).to(DEVICE)
        args = (torch.randn(9, 24, device=DEVICE), torch.randint(0, 4, (9, 2), device=DEVICE),
                torch.rand(9, 2, device=DEVICE))
    else:
        mod = QuantLinear(scheme, torch.randn(21, 45), torch.randn(21)).to(DEVICE)
        args = (torch.randn(5, 45, device=DEVICE),)
    with torch.no_grad():
        with kernel_mode("dequantize"):
            ref = mod(*args)
        with kernel_mode("kernels"):
            got = mod(*args)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_the_mode_switch():
    x = torch.randn(2, 8, device=DEVICE)
    int8 = get_scheme("int8")
    assert use_kernels(int8, x) == (DEVICE == "cuda")  # auto: kernels on CUDA only, never the interpreter
    with kernel_mode("kernels"):
        assert use_kernels(int8, x)  # on CPU the tests run with TRITON_INTERPRET=1
        assert not use_kernels(int8, x.requires_grad_())  # forward-only kernels: autograd keeps the torch path
    prev = set_kernel_mode("auto")
    assert prev == "auto"
    with pytest.raises(ConfigError, match=r"mode='fast' is unknown; choose one of \['auto', 'kernels', 'dequantize'\]"):
        set_kernel_mode("fast")


@pytest.mark.parametrize("name", ["int4", "fp8"])
def test_a_quantized_model_computes_the_same_logits_on_the_kernels(name, monkeypatch):
    # the whole model: every attention projection (QuantLinear) and every expert stack (QuantExperts)
    from moe.quant import dispatch, quantize_model
    from tests.engine.conftest import build_model

    calls = {"linear": 0, "experts": 0}
    for fn in calls:
        def counted(*a, _fn=getattr(dispatch, fn), _name=fn, **k):
            calls[_name] += 1
            return _fn(*a, **k)
        monkeypatch.setattr(dispatch, fn, counted)

    model = quantize_model(build_model(97, d_model=32, n_layers=2, n_experts=4, expert_hidden=32), name).to(DEVICE)
    ids = torch.randint(0, 97, (2, 7), device=DEVICE)
    with torch.no_grad():
        with kernel_mode("dequantize"):
            ref = model(ids)
        with kernel_mode("kernels"):
            got = model(ids)
    ref, got = (t if isinstance(t, torch.Tensor) else t.logits for t in (ref, got))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert calls == {"linear": 2 * 2, "experts": 2}  # qkv_proj + o_proj per layer, one expert stack per layer
