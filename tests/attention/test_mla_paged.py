"""Paged attention over MLA's latent cache (moe/attention/mla_paged.py): the absorbed decode on each
paged backend (torch; Triton's MLA kernel under TRITON_INTERPRET=1 without a GPU) equals the
expanded torch reference; the expanded prefill equals the absorbed one and a naive loop, with
cached prefixes, fresh and empty sequences; the engine hook (`LatentAttention`) on a mixed batch.
Odd shapes throughout (latent 13 + rope 6, 5 heads, block size 3, ragged contexts)."""

import os

import pytest
import torch

from moe.attention import PAGED_BACKENDS
from moe.attention.mla_paged import (LatentAttention, absorb_query, absorbed_latent_decode, absorbed_paged_prefill,
                                     expanded_paged_decode, expanded_paged_prefill, per_row_queries,
                                     per_token_fp8_qdq, prefill_form)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

H, NOPE, ROPE, V, C, BS = 5, 7, 6, 9, 13, 3


def case(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    context_lens = torch.tensor([1, 8, 5, 11], dtype=torch.int32)
    num_blocks, width = 20, -(-int(context_lens.max()) // BS)
    cache = torch.randn(num_blocks, BS, 1, C + ROPE, generator=g).to(dtype)
    tables = torch.randperm(num_blocks, generator=g)[:4 * width].view(4, width).to(torch.int32)
    q_nope, q_rope = torch.randn(4, H, NOPE, generator=g).to(dtype), torch.randn(4, H, ROPE, generator=g).to(dtype)
    w_uk, w_uv = torch.randn(H, NOPE, C, generator=g).to(dtype) * 0.5, torch.randn(H, V, C, generator=g).to(dtype)
    return q_nope, q_rope, cache, tables, context_lens, w_uk, w_uv, (NOPE + ROPE) ** -0.5


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_absorbed_decode_equals_the_expanded_reference(backend):
    be = PAGED_BACKENDS.get(backend)()
    args = case()
    expected = expanded_paged_decode(*args)
    got = absorbed_latent_decode(be, *args)
    assert got.shape == (4, H, V)
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4), (got - expected).abs().max()


def test_the_reference_sees_only_each_sequences_context():
    """A row past a sequence's context (garbage in its last block) changes nothing; one inside does."""
    q_nope, q_rope, cache, tables, lens, w_uk, w_uv, scale = case(seed=1)
    before = expanded_paged_decode(q_nope, q_rope, cache, tables, lens, w_uk, w_uv, scale)
    past, inside = cache.clone(), cache.clone()
    past[tables[1, 8 // BS], 8 % BS] = 1e3  # sequence 1: context 8 -> slot 8 is the first one past it
    inside[tables[1, 0], 0] = 1e3
    assert torch.equal(expanded_paged_decode(q_nope, q_rope, past, tables, lens, w_uk, w_uv, scale)[1], before[1])
    assert not torch.allclose(expanded_paged_decode(q_nope, q_rope, inside, tables, lens, w_uk, w_uv, scale)[1],
                              before[1])


def test_the_fp8_activation_rounding_is_the_quant_schemes():
    from moe.quant.schemes.base import quantize_activation

    x = torch.randn(7, 13, generator=torch.Generator().manual_seed(2)) * torch.logspace(-3, 3, 7)[:, None]
    assert torch.equal(per_token_fp8_qdq(x), quantize_activation(x))
    assert not torch.equal(per_token_fp8_qdq(x), x)


# ---------------------------------------------------------------- prefill (expanded / absorbed) and the engine hook

def naive_prefill(q_nope, q_rope, cache, tables, cu, lens, w_uk, w_uv, scale):
    """Per sequence and query row: the expanded keys and values of its causal prefix, fp64 softmax."""
    out = torch.zeros(q_nope.shape[0], H, V, dtype=torch.float64)
    for s in range(len(lens)):
        lo, hi, ctx = int(cu[s]), int(cu[s + 1]), int(lens[s])
        rows = torch.stack([cache[int(tables[s, j // BS]), j % BS, 0] for j in range(ctx)]).double()
        k = torch.cat([torch.einsum("lc,hnc->hln", rows[:, :C], w_uk.double()),
                       rows[None, :, C:].expand(H, -1, -1)], dim=-1)
        v = torch.einsum("lc,hvc->hlv", rows[:, :C], w_uv.double())
        for i, t in enumerate(range(lo, hi)):
            see = ctx - (hi - lo) + i + 1
            q = torch.cat([q_nope[t], q_rope[t]], dim=-1).double()
            p = torch.softmax(torch.einsum("hk,hlk->hl", q, k[:, :see]) * scale, dim=-1)
            out[t] = torch.einsum("hl,hlv->hv", p, v[:, :see])
    return out


def prefill_case(q_lens, lens, dtype=torch.float32, seed=3):
    """Prefill rows of sequences with cached prefixes (ctx > q_len), a fresh one (ctx == q_len) and
    an empty one (q_len 0), over the decode case's cache and weights."""
    _, _, cache, _, _, w_uk, w_uv, scale = case(dtype, seed)
    g = torch.Generator().manual_seed(seed)
    width = -(-max(lens) // BS)
    tables = torch.randperm(cache.shape[0], generator=g)[:len(lens) * width].view(len(lens), width).to(torch.int32)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    N = int(cu[-1])
    q_nope, q_rope = torch.randn(N, H, NOPE, generator=g).to(dtype), torch.randn(N, H, ROPE, generator=g).to(dtype)
    return q_nope, q_rope, cache, tables, cu, torch.tensor(lens, dtype=torch.int32), w_uk, w_uv, scale


PREFILLS = {"prefix hit + fresh + empty": ([3, 5, 0, 1], [8, 5, 4, 11]), "one fresh": ([6], [6]),
            "chunk ending mid-block": ([4, 2], [10, 7])}


@pytest.mark.parametrize("q_lens,lens", PREFILLS.values(), ids=PREFILLS.keys())
def test_expanded_prefill_equals_absorbed_and_the_naive_loop(q_lens, lens):
    args = prefill_case(q_lens, lens)
    expected = naive_prefill(*args)
    expanded = expanded_paged_prefill(*args)
    assert expanded.shape == (sum(q_lens), H, V)
    assert torch.allclose(expanded.double(), expected, atol=1e-4, rtol=1e-4), (expanded.double() - expected).abs().max()
    for backend in ("torch", "triton"):
        absorbed = absorbed_paged_prefill(PAGED_BACKENDS.get(backend)(), *args)
        assert torch.allclose(absorbed, expanded, atol=1e-4, rtol=1e-4), (backend, (absorbed - expanded).abs().max())


def test_a_fresh_prefill_is_the_prefix_hit_of_the_same_tokens():
    """One sequence prefilled whole, and the same tokens as a cached prefix of 6 + a chunk of 4: the
    chunk's rows equal the whole prefill's last 4 rows (same cache rows, same tables)."""
    q_nope, q_rope, cache, tables, _, _, w_uk, w_uv, scale = prefill_case([10], [10])
    whole = expanded_paged_prefill(q_nope, q_rope, cache, tables, torch.tensor([0, 10], dtype=torch.int32),
                                   torch.tensor([10], dtype=torch.int32), w_uk, w_uv, scale)
    chunk = expanded_paged_prefill(q_nope[6:], q_rope[6:], cache, tables, torch.tensor([0, 4], dtype=torch.int32),
                                   torch.tensor([10], dtype=torch.int32), w_uk, w_uv, scale)
    assert torch.allclose(chunk, whole[6:], atol=1e-6, rtol=1e-5)
    assert not torch.allclose(whole[:4], whole[6:])


def test_per_row_queries_are_causal_decodes():
    tables = torch.arange(12, dtype=torch.int32).view(3, 4)
    cu = torch.tensor([0, 2, 2, 5], dtype=torch.int32)  # the middle sequence has no rows
    rows, ctx = per_row_queries(tables, cu, torch.tensor([9, 4, 3], dtype=torch.int32), 5)
    assert ctx.tolist() == [8, 9, 1, 2, 3] and ctx.dtype == torch.int32
    assert torch.equal(rows, tables[[0, 0, 2, 2, 2]])


def test_the_prefill_form_is_the_cheaper_one():
    """DeepSeek-V2-Lite / V3 (512, 128, 128): expanded from 171 queries; a latent no wider than
    nope + v always expands (absorbed would never be cheaper)."""
    assert prefill_form(170, 512, 128, 128) == "absorbed" and prefill_form(171, 512, 128, 128) == "expanded"
    assert prefill_form(1, 12, 8, 16) == "expanded"
    assert prefill_form(1, C, NOPE, V) == "absorbed" and prefill_form(100, C, NOPE, V) == "expanded"
    # (4, 2, 2): 4 queries cost the same both ways; a tie stays absorbed (no expanded keys to allocate)
    assert prefill_form(4, 4, 2, 2) == "absorbed" and prefill_form(5, 4, 2, 2) == "expanded"


class Meta:
    def __init__(self, num_decodes, decode_lens, cu, prefill_lens):
        self.num_decodes, self.decode_context_lens = num_decodes, decode_lens
        self.prefill_cu_seqlens_q, self.prefill_context_lens = cu, prefill_lens
        self.prefill_max_seqlen_q = int(cu.diff().max()) if cu.numel() > 1 else 0


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("form", ["expanded", "absorbed", "auto"])
def test_latent_attention_on_a_mixed_batch(backend, form):
    """Decode rows then prefill rows, as the kv context hands them: each part equals its reference."""
    dq_nope, dq_rope, cache, d_tables, d_lens, w_uk, w_uv, scale = case(seed=3)
    pq_nope, pq_rope, _, p_tables, cu, p_lens, _, _, _ = prefill_case([3, 5, 1], [8, 5, 11])
    q = torch.cat([torch.cat([dq_nope, dq_rope], -1), torch.cat([pq_nope, pq_rope], -1)])
    attn = LatentAttention(w_uk, w_uv, scale, prefill=form)
    out = attn(PAGED_BACKENDS.get(backend)(), q, cache, Meta(4, d_lens, cu, p_lens), d_tables, p_tables)
    assert out.shape == (4 + 9, H, V)
    decode_ref = expanded_paged_decode(dq_nope, dq_rope, cache, d_tables, d_lens, w_uk, w_uv, scale)
    assert torch.allclose(out[:4], decode_ref, atol=1e-4, rtol=1e-4)
    prefill_ref = naive_prefill(pq_nope, pq_rope, cache, p_tables, cu, p_lens, w_uk, w_uv, scale)
    assert torch.allclose(out[4:].double(), prefill_ref, atol=1e-4, rtol=1e-4)
    only_decodes = attn(PAGED_BACKENDS.get(backend)(), q[:4], cache, Meta(4, d_lens, cu[:1], p_lens[:0]), d_tables,
                        p_tables[:0])
    assert torch.allclose(only_decodes, out[:4], atol=1e-6)


def test_an_unknown_prefill_form_is_refused():
    _, _, _, _, _, w_uk, w_uv, scale = case()
    with pytest.raises(ValueError, match="prefill must be one of"):
        LatentAttention(w_uk, w_uv, scale, prefill="dense")


def test_without_the_kernel_other_backends_decode_with_the_reference(monkeypatch):
    """A non-torch backend where the Triton kernel cannot run (CPU, no interpreter): the reference,
    for decodes and for the absorbed prefill's per-row decodes."""
    from types import SimpleNamespace

    from kernels.mla_decode import mla_decode_torch
    from moe.attention import mla_paged

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(mla_paged, "mla_decode", lambda *a: pytest.fail("the kernel cannot run here"))
    flash = SimpleNamespace(name="flash")
    q_nope, q_rope, cache, tables, lens, w_uk, w_uv, scale = case()
    q_lat = absorb_query(q_nope.transpose(0, 1), w_uk).transpose(0, 1)
    got = mla_paged.latent_decode(flash, q_lat, q_rope, cache, tables, lens, scale)
    assert torch.equal(got, mla_decode_torch(q_lat, q_rope, cache, tables, lens, scale))
    args = prefill_case([3, 1], [8, 5])
    assert torch.allclose(absorbed_paged_prefill(flash, *args), naive_prefill(*args).float(), atol=1e-4, rtol=1e-4)
