"""moe/quant/dispatch.py, the mutation run's additions (docs/results/mutation/run6_mutQ): the decision
`use_kernels` makes on every branch (CUDA and the interpreter stood in for by patched module
functions and an input object, so each branch is reached on any machine), the mode switch and its
restoring context manager, `fp8_tensor_cores` by device and capability, the kernels' view of a
stored weight (`quant_weight`) and the GEMM input `_act` builds. No fixtures (the driver calls these
functions directly); patches are undone in `finally`."""

import contextlib
from types import SimpleNamespace

import pytest
import torch

from kernels.mxfp4_gemm import MXWeight
from kernels.quant_gemm import QuantWeight
from moe.errors import ConfigError, UnavailableError
from moe.quant import dispatch, get_scheme
from moe.quant.schemes import quantize_activation, quantize_activation_fp8


@contextlib.contextmanager
def _patched(obj, **attrs):
    old = {k: getattr(obj, k) for k in attrs}
    for k, v in attrs.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(obj, k, v)


def _x(*, cuda=True, requires_grad=False, device="cuda"):
    # what use_kernels reads of its input: requires_grad, device, is_cuda
    return SimpleNamespace(requires_grad=requires_grad, device=torch.device(device), is_cuda=cuda)


def _decide(mode, x, scheme=None, reason=None, interp=False):
    seen = []

    def runnable(device):
        seen.append(device)
        return reason

    with _patched(dispatch, runnable_reason=runnable, interpreting=lambda: interp), dispatch.kernel_mode(mode):
        got = dispatch.use_kernels(scheme or get_scheme("int8"), x)
    return got, seen


def test_auto_takes_the_kernels_on_cuda_only_outside_the_interpreter():
    assert dispatch._mode == "auto"  # the default
    got, seen = _decide("auto", _x())
    assert got is True and seen == [torch.device("cuda")]
    assert _decide("auto", _x(), interp=True)[0] is False
    assert _decide("auto", _x(cuda=False, device="cpu"))[0] is False
    assert _decide("auto", _x(cuda=False, device="cpu"), interp=True)[0] is False
    assert _decide("auto", _x(), reason="no triton")[0] is False


def test_kernels_mode_runs_them_or_says_why_not():
    got, seen = _decide("kernels", _x(cuda=False, device="cpu"), interp=True)
    assert got is True and seen == [torch.device("cpu")]
    with pytest.raises(UnavailableError, match=r"^no CUDA here$"):
        _decide("kernels", _x(), reason="no CUDA here")


def test_dequantize_mode_schemes_without_a_layout_and_autograd_keep_the_torch_path():
    assert _decide("dequantize", _x())[0] is False
    floats = SimpleNamespace(kernel_format=None)
    assert _decide("kernels", _x(), scheme=floats) == (False, [])
    assert _decide("auto", _x(), scheme=floats) == (False, [])
    with torch.enable_grad():
        assert _decide("kernels", _x(requires_grad=True)) == (False, [])
        assert _decide("kernels", _x(requires_grad=False))[0] is True
    with torch.no_grad():  # no graph is recorded: the forward-only kernels serve a grad-requiring input
        assert _decide("kernels", _x(requires_grad=True))[0] is True


def test_the_mode_switch_returns_the_previous_mode_and_restores_it():
    assert dispatch.MODES == ("auto", "kernels", "dequantize")
    prev = dispatch.set_kernel_mode("dequantize")
    try:
        assert prev == "auto" and dispatch._mode == "dequantize"
        assert dispatch.set_kernel_mode("kernels") == "dequantize"
    finally:
        dispatch.set_kernel_mode(prev)
    assert dispatch._mode == "auto"
    with pytest.raises(RuntimeError):
        with dispatch.kernel_mode("kernels"):
            assert dispatch._mode == "kernels"
            raise RuntimeError("inside")
    assert dispatch._mode == "auto"  # restored on the way out of an exception too
    with pytest.raises(ConfigError) as err:
        dispatch.set_kernel_mode("fast")
    assert str(err.value) == "quant kernel mode='fast' is unknown; choose one of ['auto', 'kernels', 'dequantize']"
    assert dispatch._mode == "auto"


def test_fp8_tensor_cores_by_device_and_capability():
    cap = {"value": (8, 9)}
    # the capability of the device asked about (cuda:1); the current device (None) is an sm_80
    with _patched(torch.cuda, get_device_capability=lambda device=None: cap["value"] if device is not None else (8, 0)):
        with _patched(dispatch, interpreting=lambda: False):
            assert dispatch.fp8_tensor_cores(torch.device("cpu")) is False
            for c, want in (((8, 9), True), ((9, 0), True), ((8, 0), False), ((8, 6), False)):
                cap["value"] = c
                assert dispatch.fp8_tensor_cores(torch.device("cuda", 1)) is want, c
        with _patched(dispatch, interpreting=lambda: True):  # the interpreter computes E4M3 dots exactly
            cap["value"] = (8, 0)
            assert dispatch.fp8_tensor_cores(torch.device("cpu")) is True
            assert dispatch.fp8_tensor_cores(torch.device("cuda", 0)) is True


@pytest.mark.parametrize("name", ["int8", "int4", "awq", "fp8_weight", "fp8"])
def test_quant_weight_is_the_stored_layout(name):
    scheme = get_scheme(name, 16)
    stored = scheme.quantize(torch.randn(3, 6, 40))
    w = dispatch.quant_weight(scheme, stored, 40)
    assert isinstance(w, QuantWeight)
    assert (w.fmt, w.in_features) == (scheme.kernel_format, 40)
    assert torch.equal(w.qweight, stored["qweight"]) and torch.equal(w.scale, stored["scale"])
    if "zero" in stored:
        assert torch.equal(w.zero, stored["zero"])
    else:
        assert w.zero is None
    if scheme.group_size is not None:
        assert w.group_size == scheme.group_size == 16


def test_quant_weight_of_mxfp4_is_an_mx_weight():
    scheme = get_scheme("mxfp4")
    stored = scheme.quantize(torch.randn(2, 4, 64))
    w = dispatch.quant_weight(scheme, stored, 64)
    assert isinstance(w, MXWeight) and w.in_features == 64
    assert torch.equal(w.blocks, stored["blocks"]) and torch.equal(w.scales, stored["scales"])


def test_the_gemm_input():
    x = torch.randn(6, 10).T  # not contiguous
    xk, xs = dispatch._act(x, False, False)
    assert xs is None and xk.is_contiguous() and torch.equal(xk, x)
    xk, xs = dispatch._act(x, True, False)  # W8A8 without FP8 dots: quantize-dequantised per token
    assert xs is None and xk.is_contiguous() and torch.equal(xk, quantize_activation(x))
    q, s = quantize_activation_fp8(x)
    xk, xs = dispatch._act(x, True, True)
    assert xk.is_contiguous() and xs.is_contiguous()
    assert xk.dtype == q.dtype and torch.equal(xk.view(torch.uint8), q.view(torch.uint8)) and torch.equal(xs, s)


# as tests/quant/test_dispatch.py: the compiled kernels on a GPU, else the interpreter on CPU (conftest.py)
DEVICE = "cuda" if torch.cuda.is_available() and not dispatch.interpreting() else "cpu"


def test_mxfp4_modules_on_their_kernels_equal_the_dequantise_path():
    from moe.quant import QuantExperts, QuantLinear

    g = torch.Generator().manual_seed(5)
    scheme = get_scheme("mxfp4")
    lin = QuantLinear(scheme, torch.randn(8, 64, generator=g), torch.randn(8, generator=g)).to(DEVICE)
    x = torch.randn(3, 64, generator=g).to(DEVICE)
    mod = QuantExperts(scheme, torch.randn(3, 64, 64, generator=g) * 0.1, torch.randn(3, 64, 32, generator=g) * 0.1,
                       gate_up_bias_E2H=torch.randn(3, 64, generator=g), down_bias_ED=torch.randn(3, 64, generator=g),
                       activation="clamped_swiglu").to(DEVICE)
    xe = torch.randn(7, 64, generator=g).to(DEVICE)
    experts = torch.randint(0, 4, (7, 2), generator=g).to(DEVICE)  # id 3 = E: dropped
    weights = torch.rand(7, 2, generator=g).to(DEVICE)
    with torch.no_grad():
        with dispatch.kernel_mode("dequantize"):
            ref_lin, ref_exp = lin(x), mod(xe, experts, weights)
        with dispatch.kernel_mode("kernels"):
            got_lin, got_exp = lin(x), mod(xe, experts, weights)
    torch.testing.assert_close(got_lin, ref_lin, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_exp, ref_exp, rtol=1e-5, atol=1e-5)


def _kernels_vs_dequantize(mod, *args):
    with torch.no_grad():
        with dispatch.kernel_mode("dequantize"):
            ref = mod(*args)
        with dispatch.kernel_mode("kernels"):
            got = mod(*args)
    return got, ref


def _routing(T, E, seed, dtype=torch.float32, D=16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g).to(DEVICE, dtype)
    experts = torch.randint(0, E + 1, (T, 2), generator=g).to(DEVICE)  # id E: dropped
    return x, experts, torch.rand(T, 2, generator=g).to(DEVICE, dtype)


def test_mxfp4_linear_without_bias_on_its_kernel():
    from moe.quant import QuantLinear

    lin = QuantLinear(get_scheme("mxfp4"), torch.randn(8, 64), None).to(DEVICE)
    got, ref = _kernels_vs_dequantize(lin, torch.randn(3, 64).to(DEVICE))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_clamped_experts_without_biases_on_the_kernels():
    from moe.quant import QuantExperts

    mod = QuantExperts(get_scheme("int8"), torch.randn(3, 16, 16) * 0.3, torch.randn(3, 16, 8) * 0.3,
                       activation="clamped_swiglu").to(DEVICE)
    assert not mod.plain_swiglu
    got, ref = _kernels_vs_dequantize(mod, *_routing(7, 3, 6))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_bf16_biased_awq_experts_on_the_kernels_stay_bf16():
    from moe.quant import QuantExperts

    g = torch.Generator().manual_seed(7)
    mod = QuantExperts(get_scheme("awq", 16), torch.randn(3, 16, 16, generator=g) * 0.3,
                       torch.randn(3, 16, 8, generator=g) * 0.3, torch.rand(3, 16, generator=g) + 0.5,
                       gate_up_bias_E2H=torch.randn(3, 16, generator=g), down_bias_ED=torch.randn(3, 16, generator=g),
                       activation="clamped_swiglu").to(DEVICE)
    got, ref = _kernels_vs_dequantize(mod, *_routing(7, 3, 8, torch.bfloat16))
    assert got.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref.float(), rtol=0.05, atol=0.05)


def test_negative_ids_are_dropped_on_the_kernels_too():
    from moe.quant import QuantExperts

    g = torch.Generator().manual_seed(9)
    mod = QuantExperts(get_scheme("int8"), torch.randn(3, 16, 16, generator=g) * 0.3,
                       torch.randn(3, 16, 8, generator=g) * 0.3, down_bias_ED=torch.randn(3, 16, generator=g)).to(DEVICE)
    x, experts, weights = _routing(6, 3, 10)
    experts[0] = torch.tensor([-7, -7])  # every assignment of token 0 dropped, far below 0
    experts[1, 0] = -7
    got, ref = _kernels_vs_dequantize(mod, x, experts, weights)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert (got[0] == 0).all()


def test_w8a8_takes_the_fp8_dot_exactly_where_fp8_tensor_cores_exist():
    from moe.quant import QuantExperts, QuantLinear

    scales = []

    def rec(fn):
        def wrapped(*a, **k):
            scales.append(k.get("x_scale") is not None)
            return fn(*a, **k)
        return wrapped

    lin = QuantLinear(get_scheme("fp8"), torch.randn(8, 32), None).to(DEVICE)
    mod = QuantExperts(get_scheme("fp8"), torch.randn(3, 16, 16) * 0.3, torch.randn(3, 16, 8) * 0.3).to(DEVICE)
    with _patched(dispatch, quant_linear=rec(dispatch.quant_linear), quant_grouped_gemm=rec(dispatch.quant_grouped_gemm)):
        for cores in (True, False):
            scales.clear()
            with _patched(dispatch, fp8_tensor_cores=lambda device, _c=cores: _c), torch.no_grad(), \
                    dispatch.kernel_mode("kernels"):
                lin(torch.randn(3, 32).to(DEVICE))
                mod(*_routing(5, 3, 11))
            assert scales == [cores] * 3, (cores, scales)  # the linear, then gate/up and down


def test_the_grouped_gemms_read_bf16_rows_from_bf16_activations():
    # the AWQ input scale and the gate/up bias are cast to the activations' dtype: no fp32 rows reach a GEMM
    from moe.quant import QuantExperts

    dtypes = []

    def rec(x, *a, **k):
        dtypes.append(x.dtype)
        return grouped(x, *a, **k)

    grouped = dispatch.quant_grouped_gemm
    g = torch.Generator().manual_seed(12)
    mod = QuantExperts(get_scheme("awq", 16), torch.randn(3, 16, 16, generator=g) * 0.3,
                       torch.randn(3, 16, 8, generator=g) * 0.3, torch.rand(3, 16, generator=g) + 0.5,
                       gate_up_bias_E2H=torch.randn(3, 16, generator=g), activation="clamped_swiglu").to(DEVICE)
    with _patched(dispatch, quant_grouped_gemm=rec), torch.no_grad(), dispatch.kernel_mode("kernels"):
        y = mod(*_routing(6, 3, 13, torch.bfloat16))
    assert y.dtype == torch.bfloat16
    assert dtypes == [torch.bfloat16, torch.bfloat16]  # gate/up, then down
