"""`kernels/paged_attention/reference.py`: the PyTorch references against plain dense attention
over each sequence's contiguous K/V."""

import math

import pytest
import torch

from kernels.paged_attention import gather_cache, paged_attention_decode_torch, paged_attention_prefill_torch
from tests.kernels.paged_attention.cases import DEVICE, dense_reference, make_cache, make_tables

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("group", [1, 4])
def test_references_match_dense_attention(group):
    G, d, bs = 2, 32, 8
    lens = [1, 8, 13, 30]
    kc, vc = make_cache(24, bs, G, d, torch.float32)
    bt = make_tables(lens, bs, 24)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    scale = 1 / math.sqrt(d)
    q = torch.randn(len(lens), G * group, d, device=DEVICE)
    out = paged_attention_decode_torch(q, kc, vc, bt, cl, scale)
    for s, c in enumerate(lens):
        torch.testing.assert_close(out[s], dense_reference(q[s:s + 1], kc, vc, bt[s], c, scale)[0])
    q_lens = [1, 5, 13, 7]
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    qp = torch.randn(sum(q_lens), G * group, d, device=DEVICE)
    out = paged_attention_prefill_torch(qp, kc, vc, bt, cu, cl, scale)
    for s, c in enumerate(lens):
        rows = slice(int(cu[s]), int(cu[s + 1]))
        torch.testing.assert_close(out[rows], dense_reference(qp[rows], kc, vc, bt[s], c, scale))


def test_gather_cache_lays_each_sequence_out_in_table_order():
    kc, _ = make_cache(6, 4, 2, 8, torch.float32)
    bt = torch.tensor([[3, 0], [5, 5]], dtype=torch.int32, device=DEVICE)
    got = gather_cache(kc, bt)
    assert got.shape == (2, 8, 2, 8)
    assert torch.equal(got[0], torch.cat([kc[3], kc[0]])) and torch.equal(got[1], torch.cat([kc[5], kc[5]]))


def test_prefill_with_one_query_row_and_with_none():
    """The empty-input shortcut is taken for no rows or no sequences only (a single row is computed,
    not returned uninitialised), and returns `[0, H, d]`."""
    G, d, bs, H = 2, 32, 8, 4
    kc, vc = make_cache(8, bs, G, d, torch.float32)
    scale = 1 / math.sqrt(d)
    lens = [5, 11]
    bt = make_tables(lens, bs, 8)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q1 = torch.randn(1, H, d, device=DEVICE)  # one decode-like row for the second sequence only
    cu = torch.tensor([0, 0, 1], dtype=torch.int32, device=DEVICE)
    out = paged_attention_prefill_torch(q1, kc, vc, bt, cu, cl, scale)
    torch.testing.assert_close(out, dense_reference(q1, kc, vc, bt[1], 11, scale))
    q0 = torch.randn(0, H, d, device=DEVICE)
    none = paged_attention_prefill_torch(q0, kc, vc, bt, torch.zeros(3, dtype=torch.int32, device=DEVICE), cl, scale)
    assert none.shape == (0, H, d)
    empty = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    no_seqs = paged_attention_prefill_torch(q0, kc, vc, bt[:0], torch.zeros(1, dtype=torch.int32, device=DEVICE),
                                            empty, scale)
    assert no_seqs.shape == (0, H, d)


def test_reference_errors_name_the_function():
    kc, vc = make_cache(4, 8, 2, 32, torch.float32)
    bt = make_tables([5], 8, 4)
    cl = torch.tensor([5], dtype=torch.int32, device=DEVICE)
    bad_q = torch.randn(1, 4, 16, device=DEVICE)  # head_dim 16 against the cache's 32
    with pytest.raises(ValueError, match=r"^paged_attention_prefill: q head_dim 16 != cache head_dim 32$"):
        paged_attention_prefill_torch(bad_q, kc, vc, bt, torch.tensor([0, 1], dtype=torch.int32, device=DEVICE),
                                      cl, 0.1)
    with pytest.raises(ValueError, match=r"^paged_attention_decode: q head_dim 16 != cache head_dim 32$"):
        paged_attention_decode_torch(bad_q, kc, vc, bt, cl, 0.1)
