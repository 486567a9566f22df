"""The mxfp4 scheme (moe/quant/schemes/mxfp4.py) at its edges: the meta skeleton, blocks whose
exponent leaves e8m0's range (subnormal and near-fp32-max weights), the e2m1 rounding table, the
linear option and the output dtype. Added for the mutants of docs/results/mutation/run4_features/
that test_mxfp4.py's randomly scaled weights do not reach."""

import torch

from moe.quant import QuantSpec, get_scheme
from moe.quant.schemes.mxfp4 import round_to_e2m1, shared_exponents


def test_a_meta_weight_gives_an_empty_meta_skeleton_of_the_stored_layout():
    q = get_scheme("mxfp4").quantize(torch.empty(3, 5, 70, device="meta"))
    assert q["blocks"].shape == (3, 5, 3, 16) and q["scales"].shape == (3, 5, 3)
    assert q["blocks"].dtype == q["scales"].dtype == torch.uint8
    assert q["blocks"].is_meta and q["scales"].is_meta


def test_shared_exponents_are_floor_log2_minus_2_clamped_to_e8m0():
    amax = torch.tensor([0.0, 1.0, 7.99, 8.0, 2.0 ** -140, 2.0 ** -124, 3.0e38, 0.75])
    assert shared_exponents(amax).tolist() == [-127, -2, 0, 1, -127, -126, 125, -3]
    assert shared_exponents(amax).dtype == torch.int32


def test_a_subnormal_block_is_stored_with_the_smallest_scale_and_zero_codes():
    w = torch.zeros(1, 64)
    w[0, :32] = 2.0 ** -140  # floor(log2) - 2 = -142: below e8m0's -127
    w[0, 32] = 3.0e38  # near fp32's max: exponent 125
    q = get_scheme("mxfp4").quantize(w)
    assert q["scales"].tolist() == [[0, 252]]
    assert bool((q["blocks"][0, 0] == 0).all())  # 2^-140 * 2^127 = 2^-13 rounds to e2m1's 0
    assert q["blocks"][0, 1, 0].item() & 0xF == 7  # 3e38 / 2^125 = 7.05: saturates at 6 (code 7)


def test_round_to_e2m1_on_every_interval_and_tie():
    a = torch.tensor([0.0, 0.24, 0.25, 0.26, 0.75, 1.75, 1.99, 2.0, 2.5, 3.49, 3.5, 3.99, 4.0, 4.99, 5.0, 5.01,
                      6.0, 7.0, 100.0])
    want = [0.0, 0.0, 0.0, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 3.0, 4.0, 4.0, 4.0, 4.0, 4.0, 6.0, 6.0, 6.0, 6.0]
    assert round_to_e2m1(a).tolist() == want


def test_negative_values_carry_the_sign_bit_and_dequantize_in_the_asked_dtype():
    w = torch.tensor([[-6.0, -0.5, 0.5, 6.0] + [0.0] * 28])  # amax 6: exponent 0
    s = get_scheme("mxfp4")
    q = s.quantize(w)
    assert q["blocks"][0, 0, :2].tolist() == [15 | 9 << 4, 1 | 7 << 4]
    out = s.dequantize(q, 32, torch.bfloat16)
    assert out.dtype == torch.bfloat16 and torch.equal(out.float(), w)


def test_the_linear_option_decides_whether_linears_are_quantized():
    assert get_scheme("mxfp4").quantizes_linears is False
    assert QuantSpec("mxfp4", linear=True).build().quantizes_linears is True


def test_a_stacked_weight_round_trips_exactly_and_equals_its_slices_quantized_alone():
    """[E, O, I] with I = 40 (a short last block): e2m1 values times a power of two per row
    round-trip exactly; the layout is per slice, two codes a byte, the low nibble first."""
    g = torch.Generator().manual_seed(0)
    mags = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    w = mags[torch.randint(0, 8, (2, 3, 40), generator=g)]
    w = w * torch.where(torch.rand(2, 3, 40, generator=g) < 0.5, -1.0, 1.0)
    w[..., 0], w[..., 32] = 6.0, -4.0  # every block's amax in [4, 8): exponent 0 before the row's scale
    w = w * 2.0 ** torch.arange(-3, 3, dtype=torch.float32).reshape(2, 3, 1)
    s = get_scheme("mxfp4")
    q = s.quantize(w)
    assert q["blocks"].shape == (2, 3, 2, 16) and q["scales"].shape == (2, 3, 2)
    assert q["blocks"].dtype == q["scales"].dtype == torch.uint8
    assert q["scales"].tolist() == [[[124, 124], [125, 125], [126, 126]], [[127, 127], [128, 128], [129, 129]]]
    assert q["blocks"][0, 0, 0, 0].item() == 7 | (_code(w[0, 0, 1] / 2.0 ** -3) << 4)
    assert bool((q["blocks"][..., 1, 4:] == 0).all())  # the zero padding of the short block: code 0
    out = s.dequantize(q, 40, torch.bfloat16)
    assert out.shape == (2, 3, 40) and out.dtype == torch.bfloat16 and torch.equal(out.float(), w)
    assert s.dequantize(q, 40, torch.float32).dtype == torch.float32
    for e in range(2):
        qe = s.quantize(w[e])
        assert torch.equal(qe["blocks"], q["blocks"][e]) and torch.equal(qe["scales"], q["scales"][e])


def _code(v: torch.Tensor) -> int:
    mags = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    return mags.index(abs(float(v))) | (8 if float(v) < 0 or str(float(v)) == "-0.0" else 0)
