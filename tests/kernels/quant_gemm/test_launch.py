"""The quantized GEMM kernels (under TRITON_INTERPRET=1 on CPU) against the dequantise-then-matmul
reference on odd shapes, and the expert gather-GEMM against a per-token loop written here."""

import pytest
import torch

from kernels.moe_gemm import moe_routing
from kernels.quant_gemm import (dequantize_reference, quant_gather_reference, quant_grouped_gemm, quant_linear,
                                quant_linear_reference)
from tests.kernels.moe_gemm.cases import routing_case
from tests.kernels.quant_gemm.cases import DEVICE, SMALL, SMALL_LINEAR, random_weight

FMTS = ["int8", "int4", "fp8"]



def _close(y, ref):
    """fp32: exact products, only the summation order differs. bf16: the dequantised weight tile and
    the output are rounded to bf16 as in the reference, except that Triton's interpreter truncates
    fp32 -> bf16 where torch (and the compiled kernels) round to nearest: up to one bf16 ulp
    (2**-7 relative) of the largest output."""
    if y.dtype == torch.float32:
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    else:
        assert y.dtype == ref.dtype
        torch.testing.assert_close(y.float(), ref.float(), rtol=2 ** -7, atol=float(ref.abs().max()) * 2 ** -7)

def _x(*shape, dtype):
    return torch.randn(*shape, device=DEVICE).to(dtype)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quant_linear_matches_dequantise_then_matmul(fmt, dtype, one_thread):
    w = random_weight(fmt, (), 37, 70)
    bias = torch.randn(37, device=DEVICE)
    x = _x(2, 9, 70, dtype=dtype)  # leading dims, rows not a multiple of the 16-row tile
    y = quant_linear(x, w, bias, tiles=SMALL_LINEAR)
    assert y.shape == (2, 9, 37) and y.dtype == dtype
    _close(y, quant_linear_reference(x, w, bias))


def test_quant_linear_without_bias_and_a_single_row_with_default_tiles(one_thread):
    w = random_weight("int4", (), 33, 50, group_size=32)  # short last group
    x = _x(1, 50, dtype=torch.float32)
    torch.testing.assert_close(quant_linear(x, w), quant_linear_reference(x, w), rtol=1e-5, atol=1e-5)


def _per_token(x, w, experts, weights, E):
    """y[t*K + k] = weight[t, k] * x[t] @ deq(W[e])^T for each (token, slot) with e in [0, E); else 0."""
    wd = dequantize_reference(w, x.dtype).float()
    T, K = experts.shape
    y = torch.zeros(T * K, w.out_features, device=x.device)
    for t in range(T):
        for k in range(K):
            e = int(experts[t, k])
            if 0 <= e < E:
                y[t * K + k] = float(weights[t, k]) * (x[t].float() @ wd[e].t())
    return y


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_gemm_matches_a_per_token_loop(fmt, dtype, one_thread):
    T, E, K = 21, 5, 2
    experts, weights = routing_case(T, E, K)  # an expert without tokens, dropped assignments
    w = random_weight(fmt, (E,), 29, 45)
    x = _x(T, 45, dtype=dtype)
    routing = moe_routing(experts, E, block_m=16)
    w_sorted = weights.reshape(-1)[routing.sorted_assign.long()].float().contiguous()
    y = quant_grouped_gemm(x, w, routing, x_grouped=False, y_grouped=False, scale=w_sorted, tiles=SMALL)
    _close(y, _per_token(x, w, experts, weights, E).to(dtype))


@pytest.mark.parametrize("x_grouped,y_grouped", [(True, True), (False, True), (True, False)])
def test_gather_gemm_matches_the_reference_in_every_row_order(x_grouped, y_grouped, one_thread):
    T, E, K = 19, 4, 3
    experts, _ = routing_case(T, E, K, seed=1)
    w = random_weight("int4", (E,), 40, 33, group_size=16)
    routing = moe_routing(experts, E, block_m=16)
    x = _x(routing.n_assign if x_grouped else T, 33, dtype=torch.float32)
    y = quant_grouped_gemm(x, w, routing, x_grouped=x_grouped, y_grouped=y_grouped, tiles=SMALL)
    ref = quant_gather_reference(x, w, routing, x_grouped=x_grouped, y_grouped=y_grouped)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    dropped = routing.sorted_expert == E  # their rows are zeros, never garbage
    rows = torch.nonzero(dropped).squeeze(1) if y_grouped else routing.sorted_assign[dropped].long()
    assert dropped.any() and (y[rows] == 0).all()


def test_launchers_name_the_bad_argument():
    w2 = random_weight("int8", (), 8, 16)
    w3 = random_weight("int8", (3,), 8, 16)
    with pytest.raises(ValueError, match=r"quant_linear: x must be \[4, in_features=16\]"):
        quant_linear(torch.randn(4, 15, device=DEVICE), w2)
    with pytest.raises(ValueError, match="expert stacks go through quant_grouped_gemm"):
        quant_linear(torch.randn(4, 16, device=DEVICE), w3)
    routing = moe_routing(torch.zeros(4, 1, dtype=torch.long, device=DEVICE), 2, block_m=16)
    with pytest.raises(ValueError, match=r"w must be an expert stack \[E=2"):
        quant_grouped_gemm(torch.randn(4, 16, device=DEVICE), w3, routing)
    with pytest.raises(ValueError, match="tile BLOCK_N=24"):
        quant_linear(torch.randn(4, 16, device=DEVICE), w2, tiles=dict(BLOCK_M=16, BLOCK_N=24, BLOCK_K=16))


def _fp8_rows(x):
    """Per-row E4M3 activations and their fp32 scales (amax / 448), as the fp8 scheme quantizes them."""
    s = (x.float().abs().amax(-1) / 448.0).clamp(min=1e-12)
    return (x.float() / s[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn), s.contiguous()


W8A8 = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32)  # FP8 tensor-core dots take K steps of 32


@pytest.mark.skipif(DEVICE == "cuda" and torch.cuda.get_device_capability() < (8, 9), reason="FP8 dots need sm_89+")
def test_w8a8_fp8_tensor_core_gemms_match_the_scaled_reference(one_thread):
    w = random_weight("fp8", (), 37, 70)
    xq, xs = _fp8_rows(torch.randn(2, 9, 70, device=DEVICE))
    bias = torch.randn(37, device=DEVICE)
    y = quant_linear(xq, w, bias, x_scale=xs, out_dtype=torch.float32, tiles=W8A8)
    # E4M3 products are exact in fp32: only the summation order and the scales' rounding differ
    torch.testing.assert_close(y, quant_linear_reference(xq, w, bias, x_scale=xs, out_dtype=torch.float32),
                               rtol=1e-5, atol=1e-5)
    T, E, K = 21, 5, 2
    experts, weights = routing_case(T, E, K)
    we = random_weight("fp8", (E,), 29, 45)
    xq, xs = _fp8_rows(torch.randn(T, 45, device=DEVICE))
    routing = moe_routing(experts, E, block_m=16)
    w_sorted = weights.reshape(-1)[routing.sorted_assign.long()].float().contiguous()
    y = quant_grouped_gemm(xq, we, routing, y_grouped=False, scale=w_sorted, x_scale=xs, out_dtype=torch.bfloat16,
                           tiles=dict(BLOCK_N=16, BLOCK_K=32))
    dumb = _per_token(xq.float() * xs[:, None], random_weight("fp8", (E,), 29, 45), experts, weights, E)
    _close(y, dumb.to(torch.bfloat16))
    with pytest.raises(ValueError, match="x_scale \\(W8A8\\) needs float8_e4m3fn x and an fp8 weight"):
        quant_linear(xq, random_weight("int8", (), 8, 45), x_scale=xs, out_dtype=torch.float32)
