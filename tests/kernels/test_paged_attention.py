"""Paged-attention kernels: the Triton kernels (in the interpreter on CPU) against the PyTorch
references, and the references against plain dense attention."""

import math
import os

import pytest
import torch

if not torch.cuda.is_available():  # before the first kernel launch (kernels compile lazily)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels import paged_attention as pa  # noqa: E402
from moe.attention import eager_attention  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() and not pa._interpreting() else "cpu"
needs_triton = pytest.mark.skipif(pa.triton is None or (DEVICE == "cpu" and not pa._interpreting()),
                                  reason="needs triton, and CUDA or TRITON_INTERPRET=1")
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead (the interpreter is Python)
    yield
    torch.set_num_threads(n)


def make_cache(num_blocks, block_size, G, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_blocks, block_size, G, d, generator=g).to(dtype).to(DEVICE)
    v = torch.randn(num_blocks, block_size, G, d, generator=g).to(dtype).to(DEVICE)
    return k, v


def make_tables(context_lens, block_size, num_blocks, seed=0, share_prefix=True):
    """Random, non-contiguous block tables; sequences 1.. share sequence 0's first block."""
    g = torch.Generator().manual_seed(seed)
    width = max(math.ceil(c / block_size) for c in context_lens)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    rows, used = [], 0
    for i, c in enumerate(context_lens):
        n = math.ceil(c / block_size)
        row = perm[used:used + n]
        used += n
        if share_prefix and i > 0 and n > 1:
            row[0] = rows[0][0]  # a shared prefix block
        rows.append(row + [0] * (width - n))
    assert used <= num_blocks
    return torch.tensor(rows, dtype=torch.int32, device=DEVICE)


def dense_reference(q_rows, k_cache, v_cache, table, ctx, scale):
    """Contiguous K/V of one sequence -> eager causal attention for its last len(q_rows) queries."""
    bs = k_cache.shape[1]
    blocks = table[:math.ceil(ctx / bs)].long()
    k = k_cache[blocks].reshape(-1, *k_cache.shape[2:])[:ctx].float()
    v = v_cache[blocks].reshape(-1, *v_cache.shape[2:])[:ctx].float()
    q = q_rows.float()
    assert scale == 1 / math.sqrt(q.shape[-1])
    out = eager_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], causal=True)
    return out[0].transpose(0, 1)


# ---------------------------------------------------------------------------- references

@pytest.mark.parametrize("group", [1, 4])
def test_references_match_dense_attention(group):
    G, d, bs = 2, 32, 8
    lens = [1, 8, 13, 30]
    kc, vc = make_cache(24, bs, G, d, torch.float32)
    bt = make_tables(lens, bs, 24)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    scale = 1 / math.sqrt(d)
    q = torch.randn(len(lens), G * group, d, device=DEVICE)
    out = pa.paged_attention_decode_torch(q, kc, vc, bt, cl, scale)
    for s, c in enumerate(lens):
        torch.testing.assert_close(out[s], dense_reference(q[s:s + 1], kc, vc, bt[s], c, scale)[0])
    q_lens = [1, 5, 13, 7]
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    qp = torch.randn(sum(q_lens), G * group, d, device=DEVICE)
    out = pa.paged_attention_prefill_torch(qp, kc, vc, bt, cu, cl, scale)
    for s, c in enumerate(lens):
        rows = slice(int(cu[s]), int(cu[s + 1]))
        torch.testing.assert_close(out[rows], dense_reference(qp[rows], kc, vc, bt[s], c, scale))


@pytest.mark.parametrize("group,dtype", [(1, torch.float32), (4, torch.float32), (2, torch.bfloat16)])
def test_per_sequence_sdpa_prefill_matches_reference(group, dtype):
    G, d, bs = 2, 64, 16
    lens, q_lens = [1, 20, 33, 40], [1, 20, 3, 0]  # includes a sequence with no new query rows
    kc, vc = make_cache(24, bs, G, d, dtype)
    bt = make_tables(lens, bs, 24)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(q_lens), G * group, d, device=DEVICE).to(dtype)
    out = pa.paged_attention_prefill_sdpa(q, kc, vc, bt, cu, cl, 0.125)
    ref = pa.paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, 0.125)
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])


# ---------------------------------------------------------------------------- Triton vs reference

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
    out = pa.paged_attention_decode(q, kc, vc, bt, cl, scale, num_splits=splits)
    ref = pa.paged_attention_decode_torch(q, kc, vc, bt, cl, scale)
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
    out = pa.paged_attention_decode(q, kc, vc, bt, cl, 0.1, num_splits=8)  # most splits are empty
    torch.testing.assert_close(out, pa.paged_attention_decode_torch(q, kc, vc, bt, cl, 0.1), **TOL[torch.float32])


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
    out = pa.paged_attention_prefill(q, kc, vc, bt, cu, cl, scale, max_seqlen_q=max(q_lens))
    ref = pa.paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, scale)
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
    pa.reshape_and_cache(k, v, a_k, a_v, slots)
    pa.reshape_and_cache_torch(k, v, b_k, b_v, slots)
    assert torch.equal(a_k, b_k) and torch.equal(a_v, b_v)
    assert torch.equal(a_k.view(-1, G, d)[17], k[1])
    # fp32 tokens into a narrower cache are converted (rounding may differ by one ulp)
    pa.reshape_and_cache(k.float() * 1.1, v.float(), a_k, a_v, slots)
    pa.reshape_and_cache_torch(k.float() * 1.1, v.float(), b_k, b_v, slots)
    torch.testing.assert_close(a_k, b_k, **TOL[dtype])


@needs_triton
def test_backends_agree_through_get_backend():
    torch_be, triton_be = pa.get_backend("torch"), pa.get_backend("triton")
    assert pa.get_backend("auto", torch.device("cpu")).name == "torch"
    G, d, bs = 2, 64, 16
    kc, vc = make_cache(10, bs, G, d, torch.float32)
    lens = [9, 30]
    bt = make_tables(lens, bs, 10)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 9, 12], dtype=torch.int32, device=DEVICE)
    q = torch.randn(12, 4, d, device=DEVICE)
    a = torch_be.prefill(q, kc, vc, bt, cu, cl, 0.125, 9)
    b = triton_be.prefill(q, kc, vc, bt, cu, cl, 0.125, 9)
    torch.testing.assert_close(a, b, **TOL[torch.float32])


# ---------------------------------------------------------------------------- input checks

def test_launchers_reject_bad_inputs():
    kc, vc = make_cache(4, 16, 2, 64, torch.float32)
    q = torch.randn(2, 4, 64, device=DEVICE)
    bt = torch.zeros(2, 2, dtype=torch.int32, device=DEVICE)
    cl = torch.tensor([3, 4], dtype=torch.int32, device=DEVICE)
    fns = [pa.paged_attention_decode_torch] + ([pa.paged_attention_decode] if pa.triton is not None else [])
    for fn in fns:
        with pytest.raises(ValueError, match="int32"):
            fn(q, kc, vc, bt.long(), cl, 0.1)
        with pytest.raises(ValueError, match="head_dim"):
            fn(torch.randn(2, 4, 32, device=DEVICE), kc, vc, bt, cl, 0.1)
        with pytest.raises(ValueError, match="multiple"):
            fn(torch.randn(2, 3, 64, device=DEVICE), kc, vc, bt, cl, 0.1)
        with pytest.raises(ValueError, match="dtype"):
            fn(q, kc, vc.half(), bt, cl, 0.1)
        with pytest.raises(ValueError, match="2 sequences|sequences"):
            fn(q, kc, vc, bt, cl[:1], 0.1)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        pa.paged_attention_prefill_torch(q, kc, vc, bt, torch.tensor([0, 2], dtype=torch.int32), cl, 0.1)
    with pytest.raises(ValueError, match=r"\[N, 2, 64\]"):
        pa.reshape_and_cache_torch(torch.randn(3, 2, 32), torch.randn(3, 2, 32), kc, vc, torch.arange(3))


@pytest.mark.skipif(pa.triton is None or torch.cuda.is_available(), reason="checks the CPU-without-interpreter error")
def test_triton_on_cpu_without_interpreter_says_so(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    kc, vc = make_cache(2, 16, 1, 16, torch.float32)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        pa.paged_attention_decode(torch.randn(1, 1, 16), kc, vc, torch.zeros(1, 1, dtype=torch.int32),
                                  torch.ones(1, dtype=torch.int32), 0.25)
    with pytest.raises(ValueError, match="CUDA"):
        pa.get_backend("triton").check_config(16, 16, torch.float32, torch.device("cpu"))
