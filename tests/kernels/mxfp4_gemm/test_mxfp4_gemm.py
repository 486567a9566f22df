"""The MXFP4 GEMM kernels (kernels/mxfp4_gemm, under TRITON_INTERPRET=1 on CPU): the reference
dequantiser against the e2m1 / e8m0 bit formulas written here, the dense kernel against
dequantise-then-matmul on odd shapes (K tiles of one and of two 32-blocks, a short last block), the
expert gather-GEMM against a per-token loop written here (an expert without tokens, dropped
assignments), and the launchers' errors."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.moe_gemm import moe_routing  # noqa: E402
from kernels.mxfp4_gemm import (MXWeight, dequantize_reference, mxfp4_gather_reference,  # noqa: E402
                                mxfp4_grouped_gemm, mxfp4_linear, mxfp4_linear_reference)
from kernels.runtime import interpreting  # noqa: E402
from tests.kernels.moe_gemm.cases import routing_case  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
TILES = [dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32), dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64)]


def random_weight(lead: tuple, O: int, I: int, seed: int = 0) -> MXWeight:
    """Every byte value; exponents around 2^-6 (unit-scale outputs) plus e8m0 0 (2^-127, subnormal)."""
    g = torch.Generator().manual_seed(seed)
    G = -(-I // 32)
    blocks = torch.randint(0, 256, (*lead, O, G, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(118, 124, (*lead, O, G), dtype=torch.uint8, generator=g)
    scales.view(-1)[::7] = 0
    return MXWeight(blocks.to(DEVICE), scales.to(DEVICE), I)


def _close(y, ref):
    """fp32: exact products, only the summation order differs. bf16: the interpreter truncates fp32 ->
    bf16 where torch rounds to nearest, up to one bf16 ulp (2**-7) of the largest output."""
    if y.dtype == torch.float32:
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(y.float(), ref.float(), rtol=2 ** -7, atol=float(ref.abs().max()) * 2 ** -7)


def test_the_reference_dequantiser_is_the_bit_formula():
    w = random_weight((), 3, 40)
    got = dequantize_reference(w)
    for o in range(3):
        for i in range(40):
            byte = int(w.blocks[o, i // 32, (i % 32) // 2])
            code = byte & 0xF if i % 2 == 0 else byte >> 4  # the low nibble first
            sign, exp, man = code >> 3, (code >> 1) & 3, code & 1
            mag = man * 0.5 if exp == 0 else 2.0 ** (exp - 1) * (1 + man / 2)
            assert float(got[o, i]) == (-1) ** sign * mag * 2.0 ** (int(w.scales[o, i // 32]) - 127)


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mxfp4_linear_matches_dequantise_then_matmul(tiles, dtype, one_thread):
    w = random_weight((), 37, 70)  # 70 inputs: a short third block
    bias = torch.randn(37, device=DEVICE)
    x = torch.randn(2, 9, 70, device=DEVICE).to(dtype)
    y = mxfp4_linear(x, w, bias, tiles=tiles)
    assert y.shape == (2, 9, 37) and y.dtype == dtype
    _close(y, mxfp4_linear_reference(x, w, bias))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gather_gemm_equals_a_per_token_loop(dtype, one_thread):
    T, E, K, O, I = 11, 4, 2, 24, 45
    experts, weights = routing_case(T, E, K)  # expert 0 gets no tokens; some assignments dropped (id E)
    w = random_weight((E,), O, I, seed=1)
    x = torch.randn(T, I, device=DEVICE).to(dtype)
    routing = moe_routing(experts, E)
    scale = weights.reshape(-1)[routing.sorted_assign.long()].float().contiguous()
    y = mxfp4_grouped_gemm(x, w, routing, x_grouped=False, y_grouped=False, scale=scale, tiles=dict(BLOCK_N=16,
                                                                                                      BLOCK_K=32))
    deq = dequantize_reference(w, dtype).float()
    loop = torch.zeros(T * K, O, device=DEVICE)
    for t in range(T):
        for k in range(K):
            e = int(experts[t, k])
            if e < E:
                loop[t * K + k] = float(weights[t, k]) * (x[t].float() @ deq[e].t())
    _close(y, loop.to(dtype))
    grouped = mxfp4_grouped_gemm(x, w, routing, x_grouped=False, y_grouped=True, scale=scale)
    _close(grouped, mxfp4_gather_reference(x, w, routing, x_grouped=False, y_grouped=True, scale=scale))


def test_the_launchers_refuse_what_they_cannot_read():
    w = random_weight((), 8, 40)
    x = torch.randn(3, 40, device=DEVICE)
    with pytest.raises(ValueError, match="BLOCK_K=16 must be a multiple of 32"):
        mxfp4_linear(x, w, tiles=dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16))
    with pytest.raises(ValueError, match=r"x must be a row-contiguous \[3, I=40\]"):
        mxfp4_linear(torch.randn(3, 41, device=DEVICE), w)
    with pytest.raises(ValueError, match="expert stack"):
        mxfp4_grouped_gemm(x, w, moe_routing(torch.zeros(3, 1, dtype=torch.long, device=DEVICE), 2))
    with pytest.raises(ValueError, match="scales must be uint8"):
        MXWeight(w.blocks, w.scales.float(), 40)
    with pytest.raises(ValueError, match="in_features=70 does not fit 2 blocks"):
        MXWeight(w.blocks, w.scales, 70)
