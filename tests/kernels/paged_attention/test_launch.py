"""`kernels/paged_attention/launch.py` with the kernels of `triton_kernels.py` (reachable only
through their launchers): the Triton decode, prefill and cache write against the PyTorch
references, in the interpreter on CPU."""

import math

import pytest
import torch

from kernels.paged_attention import (default_num_splits, paged_attention_decode, paged_attention_decode_torch,
                                     paged_attention_prefill, paged_attention_prefill_torch, reshape_and_cache,
                                     reshape_and_cache_torch, runnable_reason)
from kernels.runtime import triton
from tests.kernels.paged_attention.cases import DEVICE, TOL, make_cache, make_tables, needs_triton

pytestmark = pytest.mark.usefixtures("one_thread")

DECODE_CASES = [  # (group, head_dim, dtype, num_splits, block_size)
    (1, 64, torch.float32, 1, 16), (2, 64, torch.bfloat16, 3, 16), (4, 64, torch.float32, 2, 8),
    (8, 64, torch.bfloat16, 1, 16), (1, 128, torch.bfloat16, 2, 16), (2, 128, torch.float32, 1, 32),
    (4, 128, torch.bfloat16, 4, 16), (8, 128, torch.float32, 3, 16),
]


@needs_triton
@pytest.mark.parametrize("group,d,dtype,splits,bs", DECODE_CASES)
def test_decode_matches_reference(group, d, dtype, splits, bs):
    G = 2 if group < 8 else 1
    lens = [1, 17, 2 * bs, 45]  # 1, not a multiple of the block size, an exact multiple
    nb = 20
    kc, vc = make_cache(nb, bs, G, d, dtype, seed=group)
    bt = make_tables(lens, bs, nb, seed=d)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = torch.randn(len(lens), G * group, d, device=DEVICE).to(dtype)
    scale = 1 / math.sqrt(d)
    out = paged_attention_decode(q, kc, vc, bt, cl, scale, num_splits=splits)
    ref = paged_attention_decode_torch(q, kc, vc, bt, cl, scale)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])


@needs_triton
def test_decode_more_splits_than_tiles_and_strided_q():
    G, group, d, bs = 2, 2, 64, 16
    kc, vc = make_cache(8, bs, G, d, torch.float32)
    lens = [1, 3, 20]
    bt = make_tables(lens, bs, 8)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = torch.randn(G * group, len(lens), d, device=DEVICE).transpose(0, 1)  # a non-contiguous view
    out = paged_attention_decode(q, kc, vc, bt, cl, 0.1, num_splits=8)  # most splits are empty
    torch.testing.assert_close(out, paged_attention_decode_torch(q, kc, vc, bt, cl, 0.1), **TOL[torch.float32])


PREFILL_CASES = [  # (group, head_dim, dtype)
    (1, 64, torch.float32), (2, 128, torch.bfloat16), (4, 64, torch.bfloat16), (8, 128, torch.float32),
]


@needs_triton
@pytest.mark.parametrize("group,d,dtype", PREFILL_CASES)
def test_prefill_matches_reference(group, d, dtype):
    G = 2 if group < 8 else 1
    bs, nb = 16, 24
    lens = [1, 20, 33, 40]  # kv lengths: cached prefix + new tokens
    q_lens = [1, 20, 3, 17]  # a 1-token prompt, a fresh prompt, a short and a long extension
    kc, vc = make_cache(nb, bs, G, d, dtype, seed=group)
    bt = make_tables(lens, bs, nb, seed=d)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(q_lens), G * group, d, device=DEVICE).to(dtype)
    scale = 1 / math.sqrt(d)
    out = paged_attention_prefill(q, kc, vc, bt, cu, cl, scale, max_seqlen_q=max(q_lens))
    ref = paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, scale)
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])


@needs_triton
@pytest.mark.parametrize("G,dtype", [(2, torch.float32), (1, torch.bfloat16), (4, torch.bfloat16)])
def test_reshape_and_cache_matches_reference(G, dtype):
    d, bs = 64, 16
    k = torch.randn(6, 3, G, d, device=DEVICE).to(dtype)[:, 1]  # a strided view, as the engine passes
    v = torch.randn(6, G, d, device=DEVICE).to(dtype)
    slots = torch.tensor([0, 17, -1, 63, 5, 40], device=DEVICE)
    a_k, a_v = make_cache(4, bs, G, d, dtype)
    b_k, b_v = a_k.clone(), a_v.clone()
    reshape_and_cache(k, v, a_k, a_v, slots)
    reshape_and_cache_torch(k, v, b_k, b_v, slots)
    assert torch.equal(a_k, b_k) and torch.equal(a_v, b_v)
    assert torch.equal(a_k.view(-1, G, d)[17], k[1])
    # fp32 tokens into a narrower cache are converted (rounding may differ by one ulp)
    reshape_and_cache(k.float() * 1.1, v.float(), a_k, a_v, slots)
    reshape_and_cache_torch(k.float() * 1.1, v.float(), b_k, b_v, slots)
    torch.testing.assert_close(a_k, b_k, **TOL[dtype])


def test_default_num_splits_is_one_off_cuda():
    assert default_num_splits(1, 1, 1 << 16, torch.device("cpu")) == 1


@pytest.mark.skipif(triton is None or torch.cuda.is_available(), reason="checks the CPU-without-interpreter error")
def test_triton_on_cpu_without_interpreter_says_so(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    kc, vc = make_cache(2, 16, 1, 16, torch.float32)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        paged_attention_decode(torch.randn(1, 1, 16), kc, vc, torch.zeros(1, 1, dtype=torch.int32),
                               torch.ones(1, dtype=torch.int32), 0.25)
    assert "paged-attention kernels run on CUDA" in runnable_reason(torch.device("cpu"))
