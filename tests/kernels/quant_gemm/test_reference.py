"""The dequantise reference against a plain per-element formula written here (so the layout the
kernels are held to is stated twice, independently): int8 `q * s`, int4 `(nibble - zero) * scale`
per group with the low nibble first, fp8 by decoding the E4M3 bit fields by hand."""

import pytest
import torch

from kernels.quant_gemm import dequantize_reference
from tests.kernels.quant_gemm.cases import random_weight


def _e4m3(b: int) -> float:
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 15, b & 7
    return sign * (2.0 ** (e - 7) * (1 + m / 8) if e else 2.0 ** -6 * m / 8)


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8"])
def test_dequantize_reference_matches_a_per_element_formula(fmt):
    w = random_weight(fmt, (), 5, 29, group_size=8)
    got = dequantize_reference(w)
    assert got.shape == (5, 29)
    q, s = w.qweight.cpu(), w.scale.cpu()
    want = torch.empty(5, 29)
    for o in range(5):
        for i in range(29):
            if fmt == "int8":
                want[o, i] = int(q[o, i]) * float(s[o, 0])
            elif fmt == "fp8":
                want[o, i] = _e4m3(int(q[o, i])) * float(s[o, 0])
            else:
                code = (int(q[o, i // 2]) >> (4 * (i % 2))) & 15
                want[o, i] = (code - int(w.zero[o, i // 8])) * float(s[o, i // 8])
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=0)


def test_quant_weight_rejects_a_layout_that_does_not_add_up():
    w = random_weight("int4", (), 4, 30, group_size=8)
    with pytest.raises(ValueError, match="needs 2 groups and 16 bytes"):
        type(w)("int4", w.qweight, w.scale, w.zero, 30, group_size=16)
    with pytest.raises(ValueError, match="fmt='int3' is unknown"):
        type(w)("int3", w.qweight, w.scale, w.zero, 30)
    with pytest.raises(ValueError, match="zero must be contiguous uint8"):
        type(w)("int4", w.qweight, w.scale, None, 30, group_size=8)
