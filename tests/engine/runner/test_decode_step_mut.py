"""Added by the seventh mutation run (docs/results/mutation/run7_mutP/): the kv context's step plan
(`PagedKVContext.attend`) and the one-token expert swap (`one_token_experts`) of the decode-step
change (21c6df3), each test written against a mutant of that change the first-pass tests let live."""

import pytest
import torch

import moe.engine.runner.decode_experts as de
from moe.experts.base import EXPERT_DISPATCH, SwiGLUExperts


def _experts(dispatch="sorted"):
    m = SwiGLUExperts(4, 8, 12, dispatch=dispatch)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # (the parameters are made empty)
        m.gate_up_proj.copy_(torch.randn(m.gate_up_proj.shape, generator=g))
        m.down_proj.copy_(torch.randn(m.down_proj.shape, generator=g))
    return m


@pytest.mark.parametrize("num_tokens", [0, 2, 5])
def test_one_token_experts_leaves_a_step_of_other_sizes_alone(num_tokens):
    """Only a one-token step swaps the dispatch: with 0, 2 or 5 tokens every module keeps `sorted`
    inside the block (a swap for several tokens would change their summation order)."""
    sorted_fn = EXPERT_DISPATCH.get("sorted")
    mods = [_experts(), _experts()]
    with de.one_token_experts(mods, num_tokens):
        assert all(m.dispatch is sorted_fn for m in mods)
    assert all(m.dispatch is sorted_fn for m in mods)


def test_one_token_experts_swaps_sorted_only_and_restores_it():
    """At one token the `sorted` modules run `active_experts_dispatch` inside the block, a module on
    another dispatch keeps its own, and afterwards (also after an exception inside) each has its
    original dispatch again, set as the attribute `dispatch` the module's forward reads."""
    sorted_fn, loop_fn = EXPERT_DISPATCH.get("sorted"), EXPERT_DISPATCH.get("loop")
    a, b, other = _experts(), _experts(), _experts("loop")
    with de.one_token_experts([a, b, other], 1):
        assert a.dispatch is de.active_experts_dispatch and b.dispatch is de.active_experts_dispatch
        assert other.dispatch is loop_fn
    assert a.dispatch is sorted_fn and b.dispatch is sorted_fn and other.dispatch is loop_fn
    with pytest.raises(RuntimeError, match="inside"):
        with de.one_token_experts([a], 1):
            raise RuntimeError("inside")
    assert a.dispatch is sorted_fn
    assert set(vars(a)) == set(vars(_experts()))  # no stray attribute left on the module
    x = torch.randn(1, 8, generator=torch.Generator().manual_seed(0))
    e, w = torch.tensor([[1, 3]]), torch.tensor([[0.25, 0.75]])
    with de.one_token_experts([a], 1):
        inside = a(x, e, w)
    assert torch.equal(inside, a(x, e, w))  # the swapped dispatch: the same output at one token


# --- PagedKVContext.attend, called directly: a step of two decodes and one prefill --------------------------

from kernels.paged_attention import paged_attention_decode_torch, paged_attention_prefill_torch  # noqa: E402
from moe.attention.paged_torch import TorchPagedAttention  # noqa: E402
from moe.engine.runner.context import AttentionMetadata, PagedKVContext  # noqa: E402

BS, G, H, D = 4, 1, 2, 8


class _Recording(TorchPagedAttention):
    """The torch backend, recording what the kv context asks of it."""

    def __init__(self):
        super().__init__()
        self.plans, self.decodes, self.prefills = [], [], 0

    def plan_decode(self, *a):
        self.plans.append(super().plan_decode(*a))
        return self.plans[-1]

    def decode(self, q, k_cache, v_cache, *a, plan=None, **kw):
        self.decodes.append((k_cache.dtype, plan))
        self.last_out = super().decode(q, k_cache, v_cache, *a, plan=plan, **kw)
        return self.last_out

    def prefill(self, *a, **kw):
        self.prefills += 1
        return super().prefill(*a, **kw)


def _meta():
    """Sequences A (decode, context 3, block 0), B (decode, context 5, blocks 1 2), C (prefill of 3, block 3)."""
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    return AttentionMetadata(slot_mapping=torch.tensor([2, 8, 12, 13, 14]), num_decodes=2,
                             decode_block_tables=i32([[0, 0], [1, 2]]), decode_context_lens=i32([3, 5]),
                             prefill_block_tables=i32([[3]]), prefill_context_lens=i32([3]),
                             prefill_cu_seqlens_q=i32([0, 3]), prefill_max_seqlen_q=3)


def _step_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, H, 5, D, generator=g), torch.randn(1, G, 5, D, generator=g),
            torch.randn(1, G, 5, D, generator=g))


def test_attend_decodes_and_prefills_one_step_with_one_plan():
    """Two layers of a step of 2 decodes + a 3-token prefill (N = 5 rows, more than the H = 2 heads):
    each layer's output is the reference decode of the first 2 rows and prefill of the other 3 on
    the cache as written; the backend is asked for a plan once, at the first layer, the plan is kept
    on the step's metadata and handed to both layers' decode; the next step plans anew."""
    be = _Recording()
    ctx = PagedKVContext(2, 6, BS, G, D, torch.float32, torch.device("cpu"), be)
    g = torch.Generator().manual_seed(0)
    for kc in ctx.k_caches + ctx.v_caches:  # the cached prefixes
        kc.copy_(torch.randn(kc.shape, generator=g))
    meta = ctx.meta = _meta()
    for layer in (0, 1):
        q, k, v = _step_inputs(layer)
        out = ctx.attend(layer, q, k, v)
        assert out.shape == (1, H, 5, D)
        q_NHd, kc, vc = q[0].transpose(0, 1), ctx.k_caches[layer], ctx.v_caches[layer]
        assert torch.equal(kc.view(-1, G, D)[meta.slot_mapping], k[0].transpose(0, 1))  # written
        want = torch.cat([
            paged_attention_decode_torch(q_NHd[:2], kc, vc, meta.decode_block_tables, meta.decode_context_lens,
                                         ctx.scale),
            paged_attention_prefill_torch(q_NHd[2:], kc, vc, meta.prefill_block_tables, meta.prefill_cu_seqlens_q,
                                          meta.prefill_context_lens, ctx.scale, 3)])
        torch.testing.assert_close(out[0].transpose(0, 1), want, atol=1e-6, rtol=1e-5)
    assert len(be.plans) == 1 and meta.decode_plan is be.plans[0]
    assert [p for _, p in be.decodes] == [be.plans[0]] * 2
    ctx.meta = _meta()
    ctx.attend(0, *_step_inputs(2))
    assert len(be.plans) == 2 and be.decodes[-1][1] is be.plans[1] is not be.plans[0]


def test_attend_refuses_calls_outside_a_step_and_batched_rows():
    ctx = PagedKVContext(1, 6, BS, G, D, torch.float32, torch.device("cpu"), TorchPagedAttention())
    with pytest.raises(RuntimeError, match=r"^PagedKVContext\.attend called outside an engine step "
                                           r"\(no batch metadata set\)$"):
        ctx.attend(0, *_step_inputs(0))
    ctx.meta = _meta()
    q, k, v = (torch.cat([t, t, t]) for t in _step_inputs(0))  # a batch of 3 rows, 5 tokens each
    with pytest.raises(ValueError, match=r"^the engine flattens a step into one row; got a batch of 3$"):
        ctx.attend(0, q, k, v)


def test_attend_on_a_latent_cache_wants_one_tensor():
    ctx = PagedKVContext(1, 6, BS, 1, D, torch.float32, torch.device("cpu"), TorchPagedAttention(), latent=True)
    ctx.meta = _meta()
    q, k, v = _step_inputs(0)
    with pytest.raises(ValueError, match=r"^a latent KV cache \(MLA\) holds one tensor: attend\(layer, q, kv, kv\) "
                                         r"with v the same as k$"):
        ctx.attend(0, q, k, v)


def test_an_fp8_cache_attends_in_the_query_dtype_without_a_step_plan():
    """FP8: each layer's blocks are dequantised to the query's dtype (bf16 here) and its tables are
    its own compacted ones, so no step plan is kept or handed on."""
    be = _Recording()
    ctx = PagedKVContext(2, 6, BS, G, D, torch.bfloat16, torch.device("cpu"), be, kv_cache_dtype="fp8_e4m3")
    ctx.meta = _meta()
    for layer in (0, 1):
        q, k, v = (t.to(torch.bfloat16) for t in _step_inputs(layer))
        assert ctx.attend(layer, q, k, v).dtype == torch.bfloat16
    # (the backend's decode then plans each call for itself: its own tables each layer)
    assert be.decodes == [(torch.bfloat16, None)] * 2 and ctx.meta.decode_plan is None


def test_a_step_of_decodes_only_makes_no_prefill_call():
    """Every row a decode (num_decodes == N): the backend's prefill is not called at all (no kernel
    launch on zero rows, which a fused varlen kernel need not accept); the output is the decode's,
    a view of it (no copy a layer)."""
    be = _Recording()
    ctx = PagedKVContext(1, 6, BS, G, D, torch.float32, torch.device("cpu"), be)
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    ctx.meta = AttentionMetadata(slot_mapping=torch.tensor([2, 8]), num_decodes=2,
                                 decode_block_tables=i32([[0, 0], [1, 2]]), decode_context_lens=i32([3, 5]),
                                 prefill_block_tables=torch.zeros(0, 1, dtype=torch.int32),
                                 prefill_context_lens=i32([]), prefill_cu_seqlens_q=i32([0]), prefill_max_seqlen_q=0)
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(1, H, 2, D, generator=g), torch.randn(1, G, 2, D, generator=g), torch.randn(1, G, 2, D, generator=g)
    out = ctx.attend(0, q, k, v)
    assert be.prefills == 0 and len(be.decodes) == 1
    assert out.data_ptr() == be.last_out.data_ptr()
    want = paged_attention_decode_torch(q[0].transpose(0, 1), ctx.k_caches[0], ctx.v_caches[0],
                                        ctx.meta.decode_block_tables, ctx.meta.decode_context_lens, ctx.scale)
    torch.testing.assert_close(out[0].transpose(0, 1), want, atol=1e-6, rtol=1e-5)
