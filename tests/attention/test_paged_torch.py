"""`moe/attention/paged_torch.py`: the `torch` paged backend's per-sequence SDPA prefill (the path
for prefills too large to pad, and on the CPU for one sequence or long enough chunks) against the
padded reference of `kernels/paged_attention`."""

import pytest
import torch

from kernels.paged_attention import paged_attention_prefill_torch
from moe.attention.paged_torch import paged_attention_prefill_sdpa
from tests.kernels.paged_attention.cases import DEVICE, TOL, make_cache, make_tables


# q_lens include a sequence with no new query rows, last and in the middle (the sequences after
# it must still be computed: rules out stopping at the first empty one). The last case has a
# second sequence with a cached prefix whose row offsets lo=2, hi=7 sum to its context 9: a
# "whole context is new" test written with the offsets' sum instead of their difference would
# send it to SDPA's is_causal, which aligns the mask top-left, not bottom-right.
@pytest.mark.parametrize("group,dtype,q_lens,lens", [
    (1, torch.float32, [1, 20, 3, 0], [1, 20, 33, 40]), (4, torch.float32, [1, 20, 3, 0], [1, 20, 33, 40]),
    (2, torch.bfloat16, [1, 20, 3, 0], [1, 20, 33, 40]), (2, torch.float32, [1, 0, 3, 17], [1, 20, 33, 40]),
    (2, torch.float32, [2, 5], [2, 9])])
@pytest.mark.parametrize("gather_all", [True, False])
def test_per_sequence_sdpa_prefill_matches_reference(group, dtype, q_lens, lens, gather_all, monkeypatch):
    """Both of its gathers: every sequence's blocks at once (views per sequence), and one sequence's
    blocks at a time (above `GATHER_ALL_MAX` elements; 0 here sends every call there)."""
    import moe.attention.paged_torch as pt
    if not gather_all:
        monkeypatch.setattr(pt, "GATHER_ALL_MAX", 0)
    G, d, bs = 2, 64, 16
    kc, vc = make_cache(24, bs, G, d, dtype)
    bt = make_tables(lens, bs, 24)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(q_lens), G * group, d, device=DEVICE).to(dtype)
    out = paged_attention_prefill_sdpa(q, kc, vc, bt, cu, cl, 0.125)
    ref = paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, 0.125)
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])


def test_bad_arguments_name_the_prefill():
    kc, vc = make_cache(4, 16, 2, 64, torch.float32)
    bt = make_tables([5], 16, 4)
    cl = torch.tensor([5], dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"^paged_attention_prefill: q must be \[tokens, n_heads, head_dim\]"):
        paged_attention_prefill_sdpa(torch.randn(5, 64, device=DEVICE), kc, vc, bt, cu, cl, 0.125)


def test_the_backend_switches_to_per_sequence_prefill_exactly_past_its_bound(monkeypatch):
    """`TorchPagedAttention.prefill` pads (seqs x heads x max_q x blocks x block_size scores) up to
    `max_padded_scores` elements and goes one sequence at a time beyond it (memory O(tokens)); the
    factors here (2 seqs, 7 heads, 5 queries, 3 blocks of 3, head dim 16, 1 kv head) are such that a
    wrong factor, or a division for a product, moves the switch. Both paths give the
    reference's output, with the given softmax scale (not SDPA's default 1/sqrt(d))."""
    import moe.attention.paged_torch as pt
    G, d, bs = 1, 16, 3
    lens, q_lens = [7, 5], [5, 2]  # 2 sequences, max_q 5, 3 blocks of 3 (= 9 >= 7 positions), 7 heads
    kc, vc = make_cache(8, bs, G, d, torch.float32)
    bt = make_tables(lens, bs, 8)
    assert tuple(bt.shape) == (2, 3)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 5, 7], dtype=torch.int32, device=DEVICE)
    q = torch.randn(7, 7 * G, d, device=DEVICE)
    padded = 2 * 7 * 5 * 3 * bs
    used = []
    monkeypatch.setattr(pt, "paged_attention_prefill_sdpa",
                        lambda *a: used.append("sdpa") or paged_attention_prefill_sdpa(*a))
    monkeypatch.setattr(pt, "paged_attention_prefill_torch",
                        lambda *a: used.append("padded") or paged_attention_prefill_torch(*a))
    ref = paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, 0.3)
    backend = pt.TorchPagedAttention()
    for bound, path in ((padded, "padded"), (padded - 1, "sdpa")):
        backend.max_padded_scores = bound
        used.clear()
        out = backend.prefill(q, kc, vc, bt, cu, cl, 0.3, max(q_lens))
        assert used == [path], (bound, used)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("q_lens,lens,path", [
    ([5], [5], "loop"), ([1], [30], "loop"), ([40], [40], "loop"),  # one sequence: always the loop on the CPU
    ([8, 8], [8, 20], "loop"), ([9, 7], [9, 30], "loop"), ([20, 2, 2], [20, 30, 50], "loop"),  # >= 8 queries a sequence
    ([8, 7], [8, 20], "padded"), ([3, 3, 3], [10, 20, 30], "padded"), ([1, 1], [5, 9], "padded")])
def test_on_the_cpu_the_backend_loops_for_one_sequence_or_eight_queries_a_sequence(monkeypatch, q_lens, lens, path):
    """`TorchPagedAttention.prefill` on the CPU: the per-sequence loop for one sequence or for at least
    `loop_min_mean_q` (8) queries a sequence on average (the boundary both ways: 16 queries over 2
    sequences loops, 15 pads), the padded reference below it; either way the reference's output."""
    import moe.attention.paged_torch as pt
    assert pt.TorchPagedAttention.loop_min_mean_q == 8
    G, d, bs = 2, 16, 4
    kc, vc = (t.cpu() for t in make_cache(40, bs, G, d, torch.float32))
    bt = make_tables(lens, bs, 40).cpu()
    cl = torch.tensor(lens, dtype=torch.int32)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(sum(q_lens), 2 * G, d)
    used = []
    monkeypatch.setattr(pt, "paged_attention_prefill_sdpa", lambda *a: used.append("loop") or paged_attention_prefill_sdpa(*a))
    monkeypatch.setattr(pt, "paged_attention_prefill_torch",
                        lambda *a: used.append("padded") or paged_attention_prefill_torch(*a))
    out = pt.TorchPagedAttention().prefill(q, kc, vc, bt, cu, cl, 0.3, max(q_lens))
    assert used == [path]
    torch.testing.assert_close(out, paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, 0.3), atol=1e-5, rtol=1e-5)


def test_decode_reference_errors_name_the_decode():
    from kernels.paged_attention import paged_attention_decode_torch
    kc, vc = make_cache(4, 16, 2, 64, torch.float32)
    bt = make_tables([5], 16, 4)
    cl = torch.tensor([5], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"^paged_attention_decode: q must be \[tokens, n_heads, head_dim\]"):
        paged_attention_decode_torch(torch.randn(1, 64, device=DEVICE), kc, vc, bt, cl, 0.125)


@pytest.mark.parametrize("slots", [[5, 0, 17], [-1, 9, -1, 3], [-1, -1], []], ids=["valid", "some-negative",
                                                                                  "all-negative", "no-tokens"])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_planned_write_equals_the_reference_write(slots, cache_dtype, index_dtype):
    # the engine plans a step's writes once (`plan_write`) and every layer writes with the plan: the cache must
    # end up exactly as the reference's write leaves it (negative slots skipped, values cast to the cache dtype)
    from kernels.paged_attention import reshape_and_cache_torch
    from moe.attention.paged_torch import TorchPagedAttention
    g = torch.Generator().manual_seed(0)
    N, G, d = len(slots), 2, 8
    k, v = torch.randn(N, G, d, generator=g), torch.randn(N, G, d, generator=g)
    ref_k, ref_v = torch.randn(3, 8, G, d, generator=g).to(cache_dtype), torch.randn(3, 8, G, d, generator=g).to(cache_dtype)
    got_k, got_v = ref_k.clone(), ref_v.clone()
    slot_mapping = torch.tensor(slots, dtype=index_dtype)
    reshape_and_cache_torch(k, v, ref_k, ref_v, slot_mapping)
    be = TorchPagedAttention()
    plan = be.plan_write(slot_mapping)
    assert (plan.keep is None) == all(s >= 0 for s in slots)
    be.write(k, v, got_k, got_v, slot_mapping, plan=plan)
    assert torch.equal(got_k, ref_k) and torch.equal(got_v, ref_v)
    with pytest.raises(ValueError, match="slot_mapping must be"):  # the planned write still checks its arguments
        be.write(k, v, got_k, got_v, torch.zeros(N + 1, dtype=torch.int64), plan=plan)


def _prefill_case(lens, q_lens, G, d, bs, num_blocks, cache_dtype=torch.float32, q_dtype=torch.float32):
    """(q, k_cache, v_cache, tables, cu_seqlens, context lens) of a prefill: random caches and scattered tables
    (tests/kernels/paged_attention/cases.py), two query heads a kv head."""
    kc, vc = make_cache(num_blocks, bs, G, d, cache_dtype)
    bt = make_tables(lens, bs, num_blocks)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(q_lens), 2 * G, d, device=DEVICE).to(q_dtype)
    return q, kc, vc, bt, cu, cl


def test_per_sequence_prefill_of_a_16_bit_cache_is_fp32_math():
    """A bf16 cache and bf16 queries are upcast and attended in fp32, as the padded reference does: the output
    is exactly the fp32 computation on the upcast values, rounded once to bf16 (bf16 SDPA would differ)."""
    q, kc, vc, bt, cu, cl = _prefill_case([9, 14], [9, 5], 2, 32, 4, 10, torch.bfloat16, torch.bfloat16)
    out = paged_attention_prefill_sdpa(q, kc, vc, bt, cu, cl, 0.3)
    in_fp32 = paged_attention_prefill_sdpa(q.float(), kc.float(), vc.float(), bt, cu, cl, 0.3)
    assert out.dtype == torch.bfloat16 and torch.equal(out, in_fp32.to(torch.bfloat16))


@pytest.mark.parametrize("room,gathers", [(0, 2), (-1, 4)])  # two sequences: one gather each of K and V, or per sequence
def test_per_sequence_prefill_gathers_all_blocks_at_once_up_to_its_bound(monkeypatch, room, gathers):
    """Up to `GATHER_ALL_MAX` elements (S x W x block x G x d, inclusive) K and V are gathered once for every
    sequence; one element fewer allowed and each sequence's blocks are gathered on their own. Same output."""
    import moe.attention.paged_torch as pt
    G, d, bs = 2, 8, 4
    q, kc, vc, bt, cu, cl = _prefill_case([6, 11], [6, 3], G, d, bs, 10)
    monkeypatch.setattr(pt, "GATHER_ALL_MAX", bt.numel() * bs * G * d + room)
    calls = []
    real = torch.Tensor.index_select
    monkeypatch.setattr(torch.Tensor, "index_select", lambda self, *a: calls.append(1) or real(self, *a))
    monkeypatch.setattr(pt, "gather_cache", lambda c, t: calls.append(1) or real(c, 0, t.reshape(-1).long()).view(
        t.shape[0], -1, *c.shape[2:]))
    out = pt.paged_attention_prefill_sdpa(q, kc, vc, bt, cu, cl, 0.3)
    assert len(calls) == gathers
    torch.testing.assert_close(out, paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, 0.3), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("gather_all", [True, False])
def test_per_sequence_prefill_of_16_bit_queries_over_an_fp32_cache(monkeypatch, gather_all):
    """bf16 queries over an fp32 cache (the other mix than test_paged_torch_rerun's): the queries are
    upcast too (SDPA wants one dtype; an upcast decided by the cache's dtype alone would pass them on in
    bf16), fp32 math, the output in the queries' dtype: the padded reference's output, on both gathers."""
    import moe.attention.paged_torch as pt
    if not gather_all:
        monkeypatch.setattr(pt, "GATHER_ALL_MAX", 0)
    q, kc, vc, bt, cu, cl = _prefill_case([7, 10], [7, 3], 2, 16, 4, 8, q_dtype=torch.bfloat16)
    out = pt.paged_attention_prefill_sdpa(q, kc, vc, bt, cu, cl, 0.3)
    assert out.dtype == torch.bfloat16
    ref = paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, 0.3)
    torch.testing.assert_close(out.float(), ref.float(), **TOL[torch.bfloat16])


def test_off_the_cpu_only_the_memory_bound_sends_a_prefill_one_sequence_at_a_time():
    """`TorchPagedAttention.per_sequence` off the CPU (each sequence's host reads would sync a GPU): the
    padded reference for one sequence and for many queries a sequence alike, the loop only past
    `max_padded_scores`; on the CPU the loop for both. Shapes only: meta tensors stand for the other device
    (the rule reads nothing else), so a rule that tested for "not CUDA", or not at all, is seen here."""
    import moe.attention.paged_torch as pt
    H, d, bs = 4, 8, 4
    for device, loops in (("cpu", True), ("meta", False)):
        one = (torch.empty(12, H, d, device=device), torch.empty(1, 3, dtype=torch.int32, device=device), 12)
        many = (torch.empty(32, H, d, device=device), torch.empty(2, 5, dtype=torch.int32, device=device), 20)
        be = pt.TorchPagedAttention()
        assert be.per_sequence(*one, bs) is loops and be.per_sequence(*many, bs) is loops, device
        be.max_padded_scores = 2 * H * 20 * 5 * bs - 1  # one element fewer than the padded scores of `many`
        assert be.per_sequence(*many, bs) is True, device
