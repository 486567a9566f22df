"""moe/quant/schemes/ (every scheme module) against independent implementations: a plain per-row / per-group loop
written here, and torchao's affine primitives (slow: importing torchao takes seconds)."""

import pytest
import torch

from moe.errors import ConfigError
from moe.quant import QuantSpec, get_scheme, quantize_activation
from moe.quant.schemes import _pack_int4, _unpack_int4

FP8 = torch.float8_e4m3fn
SHAPES = [(37, 70), (3, 5, 129), (2, 11, 256)]  # odd rows, inputs not a multiple of the group, 3-D experts


def plain_int8(w):
    out = torch.empty_like(w)
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in w.shape[:-1]]).reshape(-1, w.dim() - 1):
        row = w[tuple(idx)]
        s = max(float(row.abs().max()) / 127, 1e-12)
        out[tuple(idx)] = torch.clamp(torch.round(row / s), -127, 127) * s
    return out


def plain_int4(w, g):
    out = torch.empty_like(w)
    rows = w.reshape(-1, w.shape[-1])
    res = out.view(-1, w.shape[-1])
    for r in range(rows.shape[0]):
        for lo in range(0, w.shape[-1], g):
            chunk = rows[r, lo:lo + g]
            mn, mx = min(float(chunk.min()), 0.0), max(float(chunk.max()), 0.0)
            s = max((mx - mn) / 15, 1e-12)
            z = min(max(round(-mn / s), 0), 15)
            q = torch.clamp(torch.round(chunk / s) + z, 0, 15)
            res[r, lo:lo + g] = (q - z) * s
    return out


def plain_fp8(w):
    s = (w.abs().amax(-1, keepdim=True) / 448).clamp(min=1e-12)
    return (w / s).to(FP8).float() * s


@pytest.mark.parametrize("shape", SHAPES)
def test_int8_int4_fp8_match_plain_loops(shape):
    w = torch.randn(shape) * torch.rand(shape[-1]) * 3  # uneven column magnitudes
    torch.testing.assert_close(get_scheme("int8").fake_quantize(w), plain_int8(w), atol=1e-6, rtol=0)
    torch.testing.assert_close(get_scheme("int4", 32).fake_quantize(w), plain_int4(w, 32), atol=1e-6, rtol=0)
    torch.testing.assert_close(get_scheme("int4", 128).fake_quantize(w), plain_int4(w, 128), atol=1e-6, rtol=0)
    for name in ("fp8", "fp8_weight"):
        torch.testing.assert_close(get_scheme(name).fake_quantize(w), plain_fp8(w), atol=1e-6, rtol=0)


def test_storage_is_small_and_int4_packs_two_codes_per_byte():
    w = torch.randn(6, 256)
    q = get_scheme("int4", 128).quantize(w)
    assert q["qweight"].dtype == torch.uint8 and q["qweight"].shape == (6, 128)
    assert q["scale"].shape == (6, 2) and q["zero"].shape == (6, 2)
    codes = torch.randint(0, 16, (3, 10), dtype=torch.uint8)
    assert torch.equal(_unpack_int4(_pack_int4(codes)), codes)
    assert get_scheme("int8").quantize(w)["qweight"].dtype == torch.int8
    assert get_scheme("fp8").quantize(w)["qweight"].dtype == torch.uint8  # E4M3 bytes


def test_error_bounds():
    w = torch.randn(8, 256)
    s = get_scheme("int4", 64)
    q = s.quantize(w)
    err = (s.dequantize(q, 256, torch.float32) - w).abs().view(8, 4, 64)
    assert (err <= q["scale"].unsqueeze(-1) / 2 + 1e-6).all()  # round to nearest: half a step at most
    x = torch.randn(5, 64) * 10
    rel = (quantize_activation(x) - x).abs() / x.abs().amax(-1, keepdim=True)
    assert float(rel.max()) <= 2 ** -4  # E4M3: 3 mantissa bits, relative step 1/8 at the top binade


def test_unknown_scheme_lists_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"quantization='int3'.*\['none', 'awq', 'fp8', 'fp8_weight', 'int4', 'int8', 'mxfp4'\]"):
        QuantSpec("int3")
    with pytest.raises(ConfigError, match="quant.group_size"):
        QuantSpec("int4", group_size=0)


@pytest.mark.slow
def test_against_torchao_affine_primitives():
    # torchao is in the dev extra, so this reference runs in CI: a missing torchao is a failure, not a skip
    from torchao.quantization.quant_primitives import (MappingType, choose_qparams_affine, dequantize_affine,
                                                       quantize_affine)

    w = torch.randn(37, 256)
    block = (1, 128)
    scale, zero = choose_qparams_affine(w, MappingType.ASYMMETRIC, block, torch.uint8, 0, 15,
                                        scale_dtype=torch.float32, zero_point_dtype=torch.int32)
    ref = dequantize_affine(quantize_affine(w, block, scale, zero, torch.uint8, 0, 15), block, scale, zero,
                            torch.uint8, 0, 15)
    torch.testing.assert_close(get_scheme("int4", 128).fake_quantize(w), ref, atol=1e-5, rtol=0)
    block = (1, 256)
    scale, zero = choose_qparams_affine(w, MappingType.SYMMETRIC, block, torch.int8, -127, 127,
                                        scale_dtype=torch.float32)
    ref = dequantize_affine(quantize_affine(w, block, scale, zero, torch.int8, -127, 127), block, scale, zero,
                            torch.int8, -127, 127)
    torch.testing.assert_close(get_scheme("int8").fake_quantize(w), ref, atol=1e-5, rtol=0)
