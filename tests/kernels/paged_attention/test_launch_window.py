"""The Triton decode and prefill with a sliding window and attention sinks (GPT-OSS) against the
PyTorch references, in the interpreter on CPU. With a window, the table entries of blocks no query
can see are released blocks in the engine (NULL_BLOCK, -1): here they are poisoned with -1, so a
kernel that read one would fault or differ, while the reference gets the intact table."""

import math

import pytest
import torch

from kernels.paged_attention import (paged_attention_decode, paged_attention_decode_torch, paged_attention_prefill,
                                     paged_attention_prefill_torch)
from tests.kernels.paged_attention.cases import DEVICE, TOL, make_cache, make_tables, needs_triton

pytestmark = pytest.mark.usefixtures("one_thread")
NULL_BLOCK = -1  # moe.engine.memory.block_manager.NULL_BLOCK (kernels/ must not import moe/)


def poisoned(bt: torch.Tensor, first_seen: list[int], bs: int) -> torch.Tensor:
    """`bt` with every entry whose block ends before `first_seen[s]` (row s) set to NULL_BLOCK."""
    out = bt.clone()
    for s, lo in enumerate(first_seen):
        for j in range(out.shape[1]):
            if (j + 1) * bs - 1 < lo:
                out[s, j] = NULL_BLOCK
    return out


def sinks(H: int, on: bool):
    return torch.randn(H, generator=torch.Generator().manual_seed(H), device="cpu").to(DEVICE) * 2 if on else None


DECODE = [  # (window, sinks, splits, dtype)
    (1, True, 1, torch.float32), (5, False, 3, torch.float32), (16, True, 2, torch.bfloat16),
    (200, True, 3, torch.float32), (None, True, 1, torch.bfloat16), (None, True, 4, torch.float32),
]


@needs_triton
@pytest.mark.parametrize("window,with_sinks,splits,dtype", DECODE)
def test_decode_with_window_and_sinks_matches_reference(window, with_sinks, splits, dtype):
    G, group, d, bs, nb = 2, 2, 64, 8, 24
    lens = [1, 17, 40, 45]  # 1, mid-block, a multiple of the block size, past several windows
    kc, vc = make_cache(nb, bs, G, d, dtype, seed=3)
    bt = make_tables(lens, bs, nb, seed=5)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = torch.randn(len(lens), G * group, d, device=DEVICE).to(dtype)
    s_H, scale = sinks(G * group, with_sinks), 1 / math.sqrt(d)
    ref = paged_attention_decode_torch(q, kc, vc, bt, cl, scale, window=window, sinks_H=s_H)
    tables = bt if window is None else poisoned(bt, [max(c - window, 0) for c in lens], bs)
    out = paged_attention_decode(q, kc, vc, tables, cl, scale, num_splits=splits, window=window, sinks_H=s_H)
    assert torch.isfinite(out.float()).all()
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])


PREFILL = [  # (window, sinks, dtype)
    (1, True, torch.float32), (4, False, torch.float32), (7, True, torch.bfloat16), (100, True, torch.float32),
    (None, True, torch.float32),
]


@needs_triton
@pytest.mark.parametrize("window,with_sinks,dtype", PREFILL)
def test_prefill_with_window_and_sinks_matches_reference(window, with_sinks, dtype):
    G, group, d, bs, nb = 2, 2, 64, 8, 30
    lens = [1, 20, 40, 45]  # kv lengths: cached prefix + new tokens
    q_lens = [1, 20, 3, 37]  # a 1-token prompt, a fresh prompt, a short and a long (several tiles) extension
    kc, vc = make_cache(nb, bs, G, d, dtype, seed=7)
    bt = make_tables(lens, bs, nb, seed=9)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(q_lens), G * group, d, device=DEVICE).to(dtype)
    s_H, scale = sinks(G * group, with_sinks), 1 / math.sqrt(d)
    ref = paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, scale, window=window, sinks_H=s_H)
    # the first new token (position ctx - q_len) sees from ctx - q_len - window + 1 on
    first = [max(c - n - window + 1, 0) for c, n in zip(lens, q_lens)] if window else None
    tables = bt if window is None else poisoned(bt, first, bs)
    out = paged_attention_prefill(q, kc, vc, tables, cu, cl, scale, max_seqlen_q=max(q_lens), window=window,
                                  sinks_H=s_H)
    assert torch.isfinite(out.float()).all()
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])


@needs_triton
@pytest.mark.parametrize("kw,msg", [(dict(window=0), "window must be None or an int >= 1; got 0"),
                                    (dict(window=2.5), "window must be None or an int >= 1"),
                                    (dict(sinks_H=torch.zeros(3)), r"sinks_H must be a float \[n_heads=4\]")])
def test_bad_window_or_sinks_are_refused_naming_them(kw, msg):
    kc, vc = make_cache(4, 8, 2, 64, torch.float32)
    bt = make_tables([5], 8, 4)
    q = torch.randn(1, 4, 64, device=DEVICE)
    cl = torch.tensor([5], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=msg):
        paged_attention_decode(q, kc, vc, bt, cl, 0.1, **kw)
