"""Added by the eighth mutation run of the decode step (docs/results/mutation/run8_decode/): the torch
backend's planned cache write (`WritePlan`, `TorchPagedAttention.plan_write` / `write(..., plan=)`) and the
kv context making that plan once a step (`PagedKVContext.attend`), each test written against mutants of
that change the first-pass tests let live."""

import pytest
import torch

from kernels.paged_attention import reshape_and_cache_torch
from moe.attention.paged_torch import TorchPagedAttention, WritePlan
from moe.engine.runner.context import AttentionMetadata, PagedKVContext

BS, G, H, D = 4, 1, 2, 8


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_write_plan_keeps_slot_zero_among_negative_slots(index_dtype):
    """Slot 0 is a real slot (the first of block 0): with padding (-1) in the step it is kept, and only
    the negative slots are dropped; the slots are int64 (index_copy_'s index type) in step order."""
    plan = WritePlan.of(torch.tensor([-1, 0, 3, -2, 5], dtype=index_dtype))
    assert plan.keep is not None and plan.keep.tolist() == [False, True, True, False, True]
    assert plan.slots.dtype == torch.int64 and plan.slots.tolist() == [0, 3, 5]
    k, v = torch.randn(5, G, D), torch.randn(5, G, D)
    kc, vc = torch.zeros(2, BS, G, D), torch.zeros(2, BS, G, D)
    TorchPagedAttention().write(k, v, kc, vc, torch.tensor([-1, 0, 3, -2, 5], dtype=index_dtype), plan=plan)
    assert torch.equal(kc.view(-1, G, D)[[0, 3, 5]], k[[1, 2, 4]])
    assert torch.equal(vc.view(-1, G, D)[[0, 3, 5]], v[[1, 2, 4]])
    assert torch.count_nonzero(kc.view(-1, G, D)[[1, 2, 4, 6, 7]]) == 0  # nothing else written


@pytest.mark.parametrize("slots", [[4, 0, 7], []], ids=["valid", "no-tokens"])
def test_write_plan_without_negative_slots_has_no_mask(slots):
    plan = TorchPagedAttention().plan_write(torch.tensor(slots, dtype=torch.int32))
    assert isinstance(plan, WritePlan) and plan.keep is None
    assert plan.slots.dtype == torch.int64 and plan.slots.tolist() == slots


def test_planned_write_uses_the_plans_slots():
    """`write(..., plan=)` writes at the plan's slots (the slot mapping is only checked against the
    tokens): the plan, made once a step, is what every layer's write uses."""
    k, v = torch.randn(2, G, D), torch.randn(2, G, D)
    kc, vc = torch.zeros(2, BS, G, D), torch.zeros(2, BS, G, D)
    TorchPagedAttention().write(k, v, kc, vc, torch.tensor([1, 2]), plan=WritePlan.of(torch.tensor([6, 3])))
    assert torch.equal(kc.view(-1, G, D)[[6, 3]], k) and torch.equal(vc.view(-1, G, D)[[6, 3]], v)
    assert torch.count_nonzero(kc.view(-1, G, D)[[1, 2]]) == 0


# --- PagedKVContext.attend: the write plan, once a step ------------------------------------------------------

class _Recording(TorchPagedAttention):
    """The torch backend, recording the write plans it makes and the plan each write gets."""

    def __init__(self, plans=True):
        super().__init__()
        self.made, self.writes, self.plans = [], [], plans

    def plan_write(self, slot_mapping):
        self.made.append(super().plan_write(slot_mapping) if self.plans else None)
        return self.made[-1]

    def write(self, k, v, k_cache, v_cache, slot_mapping, plan=None):
        self.writes.append(plan)
        return super().write(k, v, k_cache, v_cache, slot_mapping, plan=plan)


def _meta(slots):
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    return AttentionMetadata(slot_mapping=torch.tensor(slots), num_decodes=2,
                             decode_block_tables=i32([[0, 0], [1, 2]]), decode_context_lens=i32([3, 5]),
                             prefill_block_tables=torch.zeros(0, 1, dtype=torch.int32),
                             prefill_context_lens=i32([]), prefill_cu_seqlens_q=i32([0]), prefill_max_seqlen_q=0)


def _inputs(seed, n=2):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, H, n, D, generator=g), torch.randn(1, G, n, D, generator=g),
            torch.randn(1, G, n, D, generator=g))


def test_attend_plans_the_write_once_a_step_and_hands_it_to_every_layer():
    """Two layers of a step: the backend's `plan_write` is called once (the first layer), the plan is kept
    on the step's metadata and every layer's write gets it; each layer's cache holds its own k and v at the
    step's slots; the next step plans anew."""
    be = _Recording()
    ctx = PagedKVContext(2, 6, BS, G, D, torch.float32, torch.device("cpu"), be)
    meta = ctx.meta = _meta([2, 8])
    for layer in (0, 1):
        q, k, v = _inputs(layer)
        ctx.attend(layer, q, k, v)
        assert torch.equal(ctx.k_caches[layer].view(-1, G, D)[[2, 8]], k[0].transpose(0, 1))
        assert torch.equal(ctx.v_caches[layer].view(-1, G, D)[[2, 8]], v[0].transpose(0, 1))
    assert len(be.made) == 1 and isinstance(be.made[0], WritePlan)
    assert meta.write_plan is be.made[0] and be.writes == [be.made[0]] * 2
    assert be.made[0].slots.tolist() == [2, 8]
    ctx.meta = _meta([3, 9])
    ctx.attend(0, *_inputs(2))
    assert len(be.made) == 2 and be.writes[-1] is be.made[1] is not be.made[0]
    assert be.made[1].slots.tolist() == [3, 9]


def test_attend_writes_without_a_plan_where_the_backend_makes_none():
    """A backend whose `plan_write` gives None (the base class's default, the graph-safe wrapper) is
    called without a plan, and the reference write leaves the cache as the planned one would."""
    be = _Recording(plans=False)
    ctx = PagedKVContext(1, 6, BS, G, D, torch.float32, torch.device("cpu"), be)
    ctx.meta = _meta([2, 8])
    q, k, v = _inputs(0)
    ctx.attend(0, q, k, v)
    assert be.writes == [None] and ctx.meta.write_plan is None
    want_k, want_v = torch.zeros_like(ctx.k_caches[0]), torch.zeros_like(ctx.v_caches[0])
    reshape_and_cache_torch(k[0].transpose(0, 1), v[0].transpose(0, 1), want_k, want_v, torch.tensor([2, 8]))
    assert torch.equal(ctx.k_caches[0], want_k) and torch.equal(ctx.v_caches[0], want_v)
