"""The int8 / int4 / fp8_weight schemes (moe/quant/schemes/) on hand-worked weights: exact codes,
scales and zero points, all-zero and one-signed rows and groups, the group-size rule and the output
dtype. Added for the mutants of docs/results/mutation/run4_features/ that the plain-loop comparison
in test_schemes.py (random weights: every group has both signs, no row is zero) let through."""

import pytest
import torch

from moe.errors import ConfigError
from moe.quant import QuantSpec, get_scheme
from moe.quant.schemes.base import EPS, FP8_DTYPE
from moe.quant.schemes.int4 import _pack_int4, _unpack_int4, check_group_size


def test_int8_codes_and_scales_are_exact():
    w = torch.tensor([[127.0, -63.5, 0.0, 1.0], [-254.0, 100.0, 3.0, -1.0]])
    q = get_scheme("int8").quantize(w)
    assert q["qweight"].dtype == torch.int8 and q["scale"].dtype == torch.float32
    assert torch.equal(q["scale"], torch.tensor([[1.0], [2.0]]))
    # round half to even: -63.5 -> -64, 1.5 -> 2, -0.5 -> -0
    assert q["qweight"].tolist() == [[127, -64, 0, 1], [-127, 50, 2, 0]]
    assert torch.equal(get_scheme("int8").dequantize(q, 4, torch.float32),
                       torch.tensor([[127.0, -64.0, 0.0, 1.0], [-254.0, 100.0, 4.0, 0.0]]))


@pytest.mark.parametrize("name", ["int8", "fp8_weight", "fp8", "int4"])
def test_an_all_zero_row_quantizes_to_zero_with_the_floor_scale(name):
    w = torch.zeros(2, 8)
    w[1] = torch.arange(8.0) - 3  # a normal row beside it
    s = get_scheme(name, 4)
    q = s.quantize(w)
    assert torch.isfinite(q["scale"]).all()
    assert float(q["scale"][0].max()) == pytest.approx(EPS, rel=1e-6)  # the floor, not 0 (0/0 = nan)
    out = s.dequantize(q, 8, torch.float32)
    assert torch.equal(out[0], torch.zeros(8))
    assert torch.isfinite(out).all()


def test_int4_one_signed_and_mixed_groups_are_exact():
    """Group size 4, scale 1 everywhere: all-positive (zero point 0), all-negative (zero point 15),
    mixed signs (zero point = -min)."""
    w = torch.tensor([[0.0, 4.0, 15.0, 7.0, -15.0, -4.0, 0.0, -7.0, -5.0, 10.0, 0.0, 2.0]])
    s = get_scheme("int4", 4)
    q = s.quantize(w)
    assert torch.equal(q["scale"], torch.ones(1, 3))
    assert q["zero"].dtype == torch.uint8 and q["zero"].tolist() == [[0, 15, 5]]
    # codes [0,4,15,7], [0,11,15,8], [0,15,5,7], low nibble first
    assert q["qweight"].tolist() == [[0 | 4 << 4, 15 | 7 << 4, 0 | 11 << 4, 15 | 8 << 4, 0 | 15 << 4, 5 | 7 << 4]]
    assert torch.equal(s.dequantize(q, 12, torch.float32), w)


def test_int4_positive_group_keeps_zero_in_range_and_uses_the_full_code_range():
    """[1, 2, 3, 30]: the range is [0, 30] (not [1, 30]), scale 2, zero point 0."""
    w = torch.tensor([[1.0, 2.0, 3.0, 30.0]])
    q = get_scheme("int4", 4).quantize(w)
    assert torch.equal(q["scale"], torch.tensor([[2.0]])) and q["zero"].tolist() == [[0]]
    assert q["qweight"].tolist() == [[0 | 1 << 4, 2 | 15 << 4]]  # round(0.5)=0, round(1)=1, round(1.5)=2


def test_int4_short_last_group_and_3d_expert_weights():
    w = torch.tensor([[[-3.0, 0.0, 12.0, 6.0, 4.0, 30.0]]]).repeat(2, 1, 1)  # [E=2, O=1, I=6], groups of 4
    w[1] *= -1
    s = get_scheme("int4", 4)
    q = s.quantize(w)
    assert q["scale"].shape == (2, 1, 2) and q["qweight"].shape == (2, 1, 4)
    assert torch.equal(q["scale"][0], torch.tensor([[1.0, 2.0]]))  # [-3, 12] / 15; [0, 30] / 15 (padding is 0)
    assert q["zero"].tolist() == [[[3, 0]], [[12, 15]]]
    assert torch.equal(s.dequantize(q, 6, torch.float32), w)


def test_fp8_weight_stores_e4m3_bytes_with_the_amax_over_448_scale():
    w = torch.tensor([[448.0, -224.0, 1.0, 0.0], [-896.0, 2.0, 0.5, 3.0]])
    s = get_scheme("fp8_weight")
    q = s.quantize(w)
    assert torch.equal(q["scale"], torch.tensor([[1.0], [2.0]]))
    assert q["qweight"].dtype == torch.uint8
    assert torch.equal(q["qweight"].view(FP8_DTYPE).float(), torch.tensor([[448.0, -224.0, 1.0, 0.0],
                                                                          [-448.0, 1.0, 0.25, 1.5]]))
    assert torch.equal(s.dequantize(q, 4, torch.float32), w)


@pytest.mark.parametrize("name", ["int8", "int4", "fp8_weight", "fp8"])
def test_dequantize_returns_the_asked_dtype(name):
    w = torch.randn(3, 8)
    s = get_scheme(name, 4)
    q = s.quantize(w.bfloat16())
    assert s.dequantize(q, 8, torch.bfloat16).dtype == torch.bfloat16
    assert s.fake_quantize(w.half()).dtype == torch.float16


def test_group_size_must_be_a_positive_even_int_and_defaults_to_128():
    assert get_scheme("int4").group_size == 128 and QuantSpec("int4").build().group_size == 128
    assert get_scheme("awq").group_size == 128
    check_group_size(2)
    for bad in (3, 65):
        with pytest.raises(ConfigError, match=f"quant.group_size={bad} must be even"):
            check_group_size(bad)
        with pytest.raises(ConfigError, match="must be even"):
            QuantSpec("int4", group_size=bad)
    for bad in (0, -2, True):
        with pytest.raises(ConfigError, match="quant.group_size=.* must be a positive int"):
            check_group_size(bad)


def test_pack_int4_gives_bytes_whatever_int_dtype_the_codes_have():
    codes = torch.tensor([[1, 15, 0, 7]])  # int64
    packed = _pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.tolist() == [[1 | 15 << 4, 0 | 7 << 4]]
    assert _unpack_int4(packed).tolist() == [[1, 15, 0, 7]]


def test_int4_symmetric_group_saturates_the_top_code_at_15():
    """[-7.5, 7.5]: scale 1, zero point round(7.5) = 8, and 7.5 rounds to 8 + 8 = 16: clamped to 15
    (a 16 would spill into the next nibble); -7.5 gives code 0."""
    w = torch.tensor([[-7.5, 7.5, 0.0, 1.0]])
    s = get_scheme("int4", 4)
    q = s.quantize(w)
    assert torch.equal(q["scale"], torch.ones(1, 1)) and q["zero"].tolist() == [[8]]
    assert q["qweight"].tolist() == [[0 | 15 << 4, 8 | 9 << 4]]
    assert s.dequantize(q, 4, torch.float32).tolist() == [[-8.0, 7.0, 0.0, 1.0]]
