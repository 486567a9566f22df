"""moe/hf/mxfp4.py by hand (the sixth mutation run, docs/results/mutation/run6_mutH/): the
dequantiser against the e2m1 table element by element (low nibble first, a leading expert dim,
the asked dtype, meta tensors, torch's default dtype), the pairing of `_blocks` / `_scales` in a
stream, GPT-OSS's interleaved gate/up rows both ways, and the kept route and export names."""

from __future__ import annotations

import pytest
import torch

from moe.hf.mxfp4 import (E2M1_VALUES, dequantize_mxfp4, dequantized_pieces, interleaved_rows_to_hf,
                          interleaved_rows_to_ours, kept_route, kept_tensors)
from moe.weights import Placement


def _codes(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, generator=g, dtype=torch.int64).to(torch.uint8)


def _by_hand(blocks, scales):
    """W[..., r, 32 g + 2 j + n] = e2m1(nibble n of byte j of block g) * 2 ** (scale[g] - 127)."""
    *lead, R, G, _ = blocks.shape
    out = torch.empty(*lead, R, G * 32, dtype=torch.float64)
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in (*lead, R, G)]).reshape(-1, len(lead) + 2).tolist():
        *pre, g = idx
        for j in range(16):
            byte = int(blocks[tuple(idx) + (j,)])
            for n, code in enumerate((byte & 15, byte >> 4)):
                out[tuple(pre) + (32 * g + 2 * j + n,)] = E2M1_VALUES[code] * 2.0 ** (int(scales[tuple(idx)]) - 127)
    return out


def test_dequantize_equals_the_table_element_by_element():
    blocks = _codes((2, 3, 2, 16))  # [E, R, G, 16]
    scales = torch.tensor([[[127, 128], [120, 131], [0, 200]], [[126, 127], [140, 100], [127, 1]]], dtype=torch.uint8)
    got = dequantize_mxfp4(blocks, scales)
    assert got.shape == (2, 3, 64) and got.dtype == torch.float32
    assert torch.equal(got.double(), _by_hand(blocks, scales))
    assert torch.equal(dequantize_mxfp4(blocks[0], scales[0]), got[0])  # no leading dim
    half = dequantize_mxfp4(blocks, scales, torch.bfloat16)
    assert half.dtype == torch.bfloat16 and torch.equal(half, got.to(torch.bfloat16))


def test_every_code_in_each_nibble():
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8).reshape(16, 1, 16)
    got = dequantize_mxfp4(codes, torch.full((16, 1), 127, dtype=torch.uint8))
    table = torch.tensor(E2M1_VALUES)
    assert torch.equal(got[:, 0::2], table[codes.reshape(16, 16).long() & 15])
    assert torch.equal(got[:, 1::2], table[codes.reshape(16, 16).long() >> 4])


def test_the_result_does_not_depend_on_torchs_default_dtype():
    blocks = torch.tensor([[[0x76] * 16]], dtype=torch.uint8)  # codes 6 (4.0) and 7 (6.0)
    scales = torch.tensor([[254]], dtype=torch.uint8)  # 6 * 2^127 overflows fp32: computed in fp32 (docstring)
    want = dequantize_mxfp4(blocks, scales, torch.float64)
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        got = dequantize_mxfp4(blocks, scales, torch.float64)
    finally:
        torch.set_default_dtype(old)
    assert got.dtype == want.dtype == torch.float64 and torch.equal(got, want)  # inf: fp32 overflows, as documented


def test_meta_tensors_give_a_meta_result_of_the_right_shape():
    out = dequantize_mxfp4(torch.empty(4, 3, 2, 16, dtype=torch.uint8, device="meta"),
                           torch.empty(4, 3, 2, dtype=torch.uint8, device="meta"))
    assert out.is_meta and out.shape == (4, 3, 64)


@pytest.mark.parametrize("blocks, scales", [((2, 3, 16), (2, 4)), ((2, 3, 8), (2, 3))])
def test_unpaired_shapes_are_refused_by_name(blocks, scales):
    with pytest.raises(ValueError) as err:
        dequantize_mxfp4(torch.zeros(blocks, dtype=torch.uint8), torch.zeros(scales, dtype=torch.uint8))
    assert str(err.value) == (f"MXFP4 blocks {blocks} and scales {scales} do not pair: "
                              "blocks must be scales' shape + (16,)")


def test_dequantized_pieces_pairs_halves_in_any_order_and_passes_the_rest_through():
    b1, s1 = _codes((2, 3, 1, 16), 1), torch.full((2, 3, 1), 127, dtype=torch.uint8)
    b2, s2 = _codes((3, 2, 16), 2), torch.full((3, 2), 126, dtype=torch.uint8)
    lone = _codes((1, 1, 16), 3)
    reads = []

    def piece(name, t):
        return name, (lambda: (reads.append(name), t)[1])

    pieces = [piece("a.weight", torch.ones(2)), piece("x.w_scales", s1), piece("y.w_blocks", b2),
              piece("b.weight", torch.zeros(3)), piece("x.w_blocks", b1), piece("y.w_scales", s2),
              piece("z.w_blocks", lone), piece("c.weight", torch.full((1,), 5.0))]
    out = list(dequantized_pieces(pieces))
    assert [name for name, _ in out] == ["a.weight", "b.weight", "x.w", "y.w", "c.weight", "z.w_blocks"]
    got = {name: read() for name, read in out}
    assert torch.equal(got["x.w"], dequantize_mxfp4(b1, s1).transpose(-1, -2)) and got["x.w"].shape == (2, 32, 3)
    assert torch.equal(got["y.w"], dequantize_mxfp4(b2, s2).transpose(-1, -2)) and got["y.w"].shape == (64, 3)
    assert torch.equal(got["z.w_blocks"], lone) and torch.equal(got["c.weight"], torch.full((1,), 5.0))
    assert torch.equal(got["a.weight"], torch.ones(2))


def test_interleaved_rows_both_ways():
    E, H = 2, 3
    t = torch.arange(E * 2 * H * 4 * 5).reshape(E, 2 * H, 4, 5)  # [E, 2H, G, 16]-like: trailing dims kept
    ours = interleaved_rows_to_ours(t)
    for e in range(E):
        for h in range(H):
            assert torch.equal(ours[e, h], t[e, 2 * h])  # gate rows first
            assert torch.equal(ours[e, H + h], t[e, 2 * h + 1])  # then up rows
    assert ours.is_contiguous() and torch.equal(interleaved_rows_to_hf(ours), t)
    s = torch.arange(E * 2 * H * 4).reshape(E, 2 * H, 4)  # scales: one trailing dim
    assert torch.equal(interleaved_rows_to_hf(interleaved_rows_to_ours(s)), s)
    assert torch.equal(interleaved_rows_to_ours(s)[1, H], s[1, 1])


def test_kept_route_places_the_stored_bytes_and_defers_the_rest():
    sentinel = [Placement("elsewhere")]
    seen = []
    route = kept_route(lambda name: (seen.append(name), sentinel)[1])
    [p] = route("model.layers.3.mlp.experts.gate_up_proj_blocks")
    assert (p.target, p.index, p.transform) == ("layers.3.ffn.experts.gate_up_blocks", (), interleaved_rows_to_ours)
    [p] = route("model.layers.0.mlp.experts.down_proj_scales")
    assert (p.target, p.index, p.transform) == ("layers.0.ffn.experts.down_scales", (), None)
    assert route("model.layers.0.mlp.experts.down_proj") is sentinel and seen == ["model.layers.0.mlp.experts.down_proj"]


def test_kept_tensors_writes_the_stored_layout_back_or_says_none():
    E, H = 2, 2
    state = {"layers.1.ffn.experts.gate_up_blocks": _codes((E, 2 * H, 1, 16), 4),
             "layers.1.ffn.experts.gate_up_scales": _codes((E, 2 * H, 1), 5),
             "layers.1.ffn.experts.down_blocks": _codes((E, 3, 1, 16), 6),
             "layers.1.ffn.experts.down_scales": _codes((E, 3, 1), 7)}
    hf = "model.layers.1.mlp.experts.gate_up_proj"
    out = kept_tensors(state, hf, "layers.1.ffn.experts.gate_up_proj")
    assert sorted(out) == [hf + "_blocks", hf + "_scales"]
    assert torch.equal(out[hf + "_blocks"], interleaved_rows_to_hf(state["layers.1.ffn.experts.gate_up_blocks"]))
    assert torch.equal(out[hf + "_scales"], interleaved_rows_to_hf(state["layers.1.ffn.experts.gate_up_scales"]))
    down = kept_tensors(state, "D", "layers.1.ffn.experts.down_proj")
    assert down.keys() == {"D_blocks", "D_scales"}
    assert down["D_blocks"] is not None and torch.equal(down["D_blocks"], state["layers.1.ffn.experts.down_blocks"])
    assert torch.equal(down["D_scales"], state["layers.1.ffn.experts.down_scales"])
    assert kept_tensors(state, "X", "layers.1.ffn.experts.down_bias") is None  # not a projection
    assert kept_tensors(state, "X", "layers.1.attn.o_proj.weight") is None
    assert kept_tensors(state, "X", "layers.0.ffn.experts.gate_up_proj") is None  # layer 0 is not MXFP4


def test_the_e8m0_nan_scale_gives_no_finite_value():
    """Scale byte 0xFF is NaN in OCP's e8m0: no code of such a block may come out as a finite number."""
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8).reshape(16, 1, 16)
    out = dequantize_mxfp4(codes, torch.full((16, 1), 255, dtype=torch.uint8))
    assert not torch.isfinite(out).any()
