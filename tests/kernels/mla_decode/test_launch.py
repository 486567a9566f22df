"""`kernels/mla_decode/launch.py` with the Triton kernel (in the interpreter on CPU) against the
PyTorch reference: DeepSeek's latent (512 + 64) and odd small ones, 1, 5, 16 and 20 heads (one
head tile, a partial tile, two), ragged contexts with a context of 1, block sizes 1 to 16, one
split and splits of which some are empty, fp32 and 16-bit caches."""

import pytest
import torch

from kernels.mla_decode import mla_decode, mla_decode_torch
from kernels.mla_decode.launch import tiles
from tests.kernels.mla_decode.cases import mla_case, needs_triton

pytestmark = [needs_triton, pytest.mark.usefixtures("one_thread")]

TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
       torch.float16: dict(atol=5e-3, rtol=5e-3)}
CASES = [  # (rank, rope, heads, lens, block_size, dtype, num_splits)
    (512, 64, 16, [1, 37, 16], 16, torch.bfloat16, 1),
    (512, 64, 1, [23, 1], 16, torch.float32, 3),
    (13, 6, 5, [1, 8, 5, 11], 3, torch.float32, 1),
    (13, 6, 20, [7, 1, 23], 1, torch.float32, 4),  # context 1 with 4 splits: three are empty
    (32, 16, 16, [40, 2], 5, torch.float16, 2),
    (96, 32, 1, [1], 16, torch.bfloat16, 1),
]


@pytest.mark.parametrize("rank,rope,heads,lens,bs,dtype,splits", CASES)
def test_the_kernel_matches_the_reference(rank, rope, heads, lens, bs, dtype, splits):
    args = mla_case(rank, rope, heads, lens, bs, dtype)
    got = mla_decode(*args, num_splits=splits)
    expected = mla_decode_torch(*args)
    assert got.shape == (len(lens), heads, rank) and got.dtype == dtype
    assert torch.allclose(got.float(), expected.float(), **TOL[dtype]), (got.float() - expected.float()).abs().max()


def test_rows_past_the_context_are_never_read():
    """Huge values past sequence 0's context and in unused table entries change nothing."""
    q_lat, q_rope, cache, tables, lens, scale = mla_case(13, 6, 5, [5, 9], 3, torch.float32)
    before = mla_decode(q_lat, q_rope, cache, tables, lens, scale, num_splits=2)
    poisoned = cache.clone()
    poisoned[tables[0, 1].long(), 2] = 1e4  # sequence 0's position 5: the first past its context
    assert not bool((tables[1, :3] == tables[0, 1]).any())
    after = mla_decode(q_lat, q_rope, poisoned, tables, lens, scale, num_splits=2)
    assert torch.equal(after, before)
    poisoned[tables[0, 0].long(), 1] = 1e4  # inside: must change sequence 0
    assert not torch.allclose(mla_decode(q_lat, q_rope, poisoned, tables, lens, scale)[0], before[0])


def test_strided_queries_and_an_empty_batch():
    """Queries sliced from wider tensors (the engine's absorbed q is a view) and T = 0."""
    q_lat, q_rope, cache, tables, lens, scale = mla_case(13, 6, 5, [4, 7], 3, torch.float32)
    wide = torch.cat([q_rope, q_lat], dim=-1)
    got = mla_decode(wide[..., 6:], wide[..., :6], cache, tables, lens, scale)
    assert torch.allclose(got, mla_decode_torch(q_lat, q_rope, cache, tables, lens, scale), **TOL[torch.float32])
    empty = mla_decode(q_lat[:0], q_rope[:0], cache, tables[:0], lens[:0], scale)
    assert empty.shape == (0, 5, 13)
    with pytest.raises(ValueError, match="num_splits must be >= 1"):
        mla_decode(q_lat, q_rope, cache, tables, lens, scale, num_splits=0)


def test_tiles_fit_deepseeks_latent():
    """512 + 64 is tiled without padding; fp32 takes half-height tiles (shared memory on sm_80)."""
    t16, t32 = tiles(512, 64, torch.bfloat16), tiles(512, 64, torch.float32)
    assert (t16["BLOCK_C"], t16["BLOCK_R"], t16["BLOCK_H"]) == (512, 64, 16)
    assert t32["BLOCK_N"] <= t16["BLOCK_N"]
    assert tiles(13, 6, torch.float32)["BLOCK_C"] == 16 and tiles(13, 6, torch.float32)["BLOCK_R"] == 16
