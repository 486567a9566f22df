"""`kernels/mla_decode/reference.py` against a plain loop (one sequence, one head at a time, the
rows read block by block through the table)."""

import pytest
import torch

from kernels.mla_decode import mla_decode_torch
from tests.kernels.mla_decode.cases import mla_case

pytestmark = pytest.mark.usefixtures("one_thread")


def loop_reference(q_lat, q_rope, cache, tables, lens, scale):
    T, H, C = q_lat.shape
    bs = cache.shape[1]
    out = torch.zeros(T, H, C, dtype=torch.float64)
    for t in range(T):
        rows = torch.stack([cache[int(tables[t, j // bs]), j % bs, 0] for j in range(int(lens[t]))]).double()
        for h in range(H):
            s = (rows[:, :C] @ q_lat[t, h].double() + rows[:, C:] @ q_rope[t, h].double()) * scale
            p = torch.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ rows[:, :C]
    return out


@pytest.mark.parametrize("rank,rope,heads,lens,bs", [(13, 6, 5, [1, 8, 5, 11], 3), (512, 64, 2, [1, 33], 16),
                                                     (8, 4, 1, [1], 1)])
def test_the_reference_is_the_loop(rank, rope, heads, lens, bs):
    args = mla_case(rank, rope, heads, lens, bs, torch.float32)
    args = tuple(a.cpu() if torch.is_tensor(a) else a for a in args)
    got = mla_decode_torch(*args)
    assert got.shape == (len(lens), heads, rank) and got.dtype == torch.float32
    assert torch.allclose(got.double(), loop_reference(*args), atol=1e-5, rtol=1e-5)


def test_a_context_of_one_returns_that_latent():
    q_lat, q_rope, cache, tables, lens, scale = mla_case(13, 6, 3, [1, 4], 3, torch.float32)
    got = mla_decode_torch(q_lat, q_rope, cache, tables, lens, scale)
    first = cache[tables[0, 0].long(), 0, 0, :13]
    assert torch.allclose(got[0], first.expand(3, -1))
    assert not torch.allclose(got[1], cache[tables[1, 0].long(), 0, 0, :13].expand(3, -1))
