"""`torch` paged backend: the gather-based PyTorch references of `kernels/paged_attention` (any
device, any dtype); the engine's default on CPU.

Its decode (without sinks) is the reference's arithmetic with fewer operations: at batch 1 on
CPU, when the sequence's blocks are consecutive in the cache, no gather and no mask at all: a
view of exactly its `context_len` positions (HF's contiguous cache costs nothing more; at batch 1
and a short context the reference's gather, mask and einsum copies were 3x the attention
itself); otherwise the blocks gathered into scratch tensors the backend keeps across layers and
steps, then fused attention or two matmuls (`paged_torch_decode.py`: the gather's allocations and
the permuted copies were most of the attention at batch 8-64). Both give the reference's output
to fp32 rounding (`-inf` scores contribute exact zeros to the softmax; the shorter rows of the
contiguous path may round the sums differently, by one ulp at most in the tests), checked by
tests/attention/test_paged_torch.py and tests/attention/test_paged_torch_decode.py. What depends
only on the step's tables (the span, the gather's index, the masks) is worked out once a step
(`plan_decode`), not in every layer; so is the write's slot mapping (`plan_write`: the int64 slots
and whether any is negative, a host read that cost ~10 us in every layer at batch 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.paged_attention import (check_attention, check_cu_seqlens, check_write, copy_to_slots, gather_cache, kept_slots,
                                     paged_attention_decode_torch, paged_attention_prefill_torch, reshape_and_cache_torch)
from moe.attention.base import PAGED_BACKENDS, PagedAttentionBackend, allowed_mask, with_sink_column
from moe.attention.paged_torch_decode import DecodePlan, DecodeWorkspace, decode_gathered


GATHER_ALL_MAX = 1 << 22  # elements of K (and of V) the per-sequence prefill gathers in one call (16 MiB in fp32)


def paged_attention_prefill_sdpa(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens,
                                 scale: float, window=None, sinks_H=None) -> torch.Tensor:
    """Same as `paged_attention_prefill_torch`, one sequence at a time through PyTorch's fused
    attention (memory O(tokens), not O(seqs x max_q x max_kv)); one host sync. A window is an
    explicit mask, sinks an extra zero key with the sink logit in the mask (`with_sink_column`).
    fp32 math (16-bit caches and queries upcast), as the reference's."""
    check_attention(q, k_cache, v_cache, block_tables, context_lens, "paged_attention_prefill")
    check_cu_seqlens(q, cu_seqlens_q, context_lens)
    N, H, d = q.shape
    S, W = block_tables.shape
    _, bs, G, _ = k_cache.shape
    out = torch.empty_like(q)
    # Every sequence's blocks in one gather, then a view per sequence (10-20% cheaper than a gather per sequence,
    # benchmarks/prefill_attention_ab.py's cases, bit-identical), unless that gather would be large: then one
    # sequence's blocks at a time (memory O(one context)).
    whole = S * W * bs * G * d <= GATHER_ALL_MAX
    if whole:
        k_all, v_all = gather_cache(k_cache, block_tables), gather_cache(v_cache, block_tables)  # [S, W * bs, G, d]
    for s, (lo, hi, ctx) in enumerate(zip(cu_seqlens_q[:-1].tolist(), cu_seqlens_q[1:].tolist(),
                                          context_lens.tolist())):
        if hi == lo:
            continue
        if whole:
            k, v = k_all[s, :ctx], v_all[s, :ctx]
        else:
            blocks = block_tables[s, :-(-ctx // bs)].long()
            k = k_cache.index_select(0, blocks).view(-1, G, d)[:ctx]
            v = v_cache.index_select(0, blocks).view(-1, G, d)[:ctx]
        k, v = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)  # [1, G, ctx, d]
        qs = q[lo:hi].transpose(0, 1).unsqueeze(0)  # [1, H, q_len, d]
        if qs.dtype != torch.float32 or k.dtype != torch.float32:  # fp32 math for 16-bit caches, as the reference
            qs, k, v = qs.float(), k.float(), v.float()
        if hi - lo == ctx and window is None and sinks_H is None:
            mask, causal = None, True
        else:  # queries are the last q_len positions: bottom-right aligned causal mask
            mask, causal = allowed_mask(hi - lo, ctx, window, q.device), False
            if sinks_H is not None:
                k, v, mask = with_sink_column(qs, k, v, mask, sinks_H)
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                           enable_gqa=H != G)
        out[lo:hi] = o[0].transpose(0, 1).to(q.dtype)
    return out


def paged_attention_decode_matmul(q, k_cache, v_cache, block_tables, context_lens, scale: float) -> torch.Tensor:
    """`paged_attention_decode_torch` without window or sinks, by matmuls (the reference's
    einsums lower to the same batched matmuls, after copies of their permuted operands). The
    compiled decode step computes it with its own layout of the gathered blocks (`graph_decode_attention`
    in moe/engine/runner/compiled.py); the eager backend's gathered path is `decode_gathered`."""
    check_attention(q, k_cache, v_cache, block_tables, context_lens, "paged_attention_decode")
    S, H, d = q.shape
    G = k_cache.shape[2]
    k_SLGd = gather_cache(k_cache, block_tables).float()
    v_SLGd = gather_cache(v_cache, block_tables).float()
    L = k_SLGd.shape[1]
    scores_SGRL = torch.matmul(q.reshape(S, G, H // G, d).float(), k_SLGd.permute(0, 2, 3, 1)) * scale
    valid_SL = torch.arange(L, device=q.device)[None, :] < context_lens[:, None]
    scores_SGRL = scores_SGRL.masked_fill(~valid_SL[:, None, None, :], float("-inf"))
    out_SGRd = torch.matmul(torch.softmax(scores_SGRL, dim=-1), v_SLGd.transpose(1, 2))
    return out_SGRd.reshape(S, H, d).to(q.dtype)


def decode_contiguous(q, k_cache, v_cache, first_slot: int, context_len: int, scale: float) -> torch.Tensor:
    """One sequence (`q [1, H, d]`) whose `context_len` cached tokens sit in consecutive slots
    from `first_slot`: attention over a view of them (no gather, no mask)."""
    _, H, d = q.shape
    G = k_cache.shape[2]
    if k_cache.is_contiguous() and v_cache.is_contiguous():
        # [1, G, L, d] views made in one call each (with the reshape/slice/transpose/unsqueeze chain below, a
        # batch-1 layer call took 18.4 us, with these 14.9: docs/results/generate/plan_1205)
        size, stride = (1, G, context_len, d), (G * context_len * d, d, G * d, 1)
        k_1GLd = k_cache.as_strided(size, stride, k_cache.storage_offset() + first_slot * G * d)
        v_1GLd = v_cache.as_strided(size, stride, v_cache.storage_offset() + first_slot * G * d)
    else:
        k_1GLd = k_cache.view(-1, G, d)[first_slot:first_slot + context_len].transpose(0, 1).unsqueeze(0)
        v_1GLd = v_cache.view(-1, G, d)[first_slot:first_slot + context_len].transpose(0, 1).unsqueeze(0)
    q_1GRd = q.reshape(1, G, H // G, d)
    if q.dtype != torch.float32 or k_1GLd.dtype != torch.float32:  # (fp32 math for 16-bit caches and queries)
        q_1GRd, k_1GLd, v_1GLd = q_1GRd.float(), k_1GLd.float(), v_1GLd.float()
    # one fused call on the strided views (each kv head's R query heads are its R "queries"): ~10 us a
    # layer call cheaper than the two matmuls, scale and softmax it replaces (interleaved A/B by CPU
    # time, contexts 20-190, this model's G=4, d=32: docs/results/generate/perf_1204c)
    out_1GRd = F.scaled_dot_product_attention(q_1GRd, k_1GLd, v_1GLd, scale=scale)
    return out_1GRd.reshape(1, H, d).to(q.dtype)


def contiguous_span(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int):
    """(first slot, context length) of a single sequence on the CPU whose used blocks are
    consecutive ids, else None. Reads the table on the host: only for CPU tensors (no device
    sync; the backend does not call it under torch.compile, where a host check breaks the graph)."""
    if block_tables.shape[0] != 1 or block_tables.device.type != "cpu":
        return None
    # Host lists, compared in Python: two tensor calls (once a step, in `plan_decode`; the tensor comparison
    # it replaces was ~8 small ops, 60 us on the development CPU, then paid at every layer).
    ctx = context_lens.tolist()[0]
    n = -(-ctx // block_size)
    if n == 0 or n > block_tables.shape[1]:
        return None
    ids = block_tables[0].tolist()
    first = ids[0]
    if ids[:n] != list(range(first, first + n)):
        return None
    return first * block_size, ctx


class WritePlan:
    """A step's slot mapping as the torch backend's write uses it in every layer: int64 `slots`
    of the tokens it writes, and `keep` (a bool mask over the step's tokens) when some slots are
    negative (dropped, as `reshape_and_cache_torch` drops them), else None (`kept_slots`)."""

    def __init__(self, slots: torch.Tensor, keep):
        self.slots, self.keep = slots, keep

    @staticmethod
    def of(slot_mapping: torch.Tensor) -> "WritePlan":
        return WritePlan(*kept_slots(slot_mapping))


@PAGED_BACKENDS.register("torch")
class TorchPagedAttention(PagedAttentionBackend):
    """Prefills run either padded (`paged_attention_prefill_torch`: one set of einsums over [seqs, max_q,
    max_kv]) or one sequence at a time through fused attention (`paged_attention_prefill_sdpa`). The
    loop: when the padded score tensor (seqs x heads x max_q x max_kv) would exceed `max_padded_scores`
    elements (memory), and on the CPU for one sequence or for `loop_min_mean_q` or more queries a sequence
    on average. Measured on the 2-core CPU, fp32, head dims 32 and 64 (`python -m
    benchmarks.prefill_attention_ab`, docs/results/generate/prefill_1205): the loop's calls cost tens of
    us a sequence, and it wins wherever the sequences bring enough queries to pay for them: 2.3-2.5x
    cheaper for one prompt of 12-64 tokens, 4.0-4.1x for 32 prompts of 8-64, 1.8-2.0x for four chunks of
    2-30 queries after up to 90 cached tokens; the padded einsums stay cheaper for 16 sequences of 1-3
    queries each (the loop 0.72-0.96x; a speculative verify's rows are such), and the two are about even
    at 16 x 4-8 (0.89-1.12x). Elsewhere (CUDA: each sequence's host reads would sync) only the memory bound."""

    name = "torch"
    max_padded_scores = 1 << 24
    loop_min_mean_q = 8

    def __init__(self):
        self.workspace = DecodeWorkspace()  # the gathered decode's scratch tensors, reused by every layer and step

    def plan_write(self, slot_mapping):
        """Once a step: the slots as int64, with the negative ones (padding, which the write drops)
        found by one host read instead of one in every layer (`WritePlan`). None under
        torch.compile (a host read there is a graph break)."""
        if torch.compiler.is_compiling():
            return None
        return WritePlan.of(slot_mapping)

    def write(self, k, v, k_cache, v_cache, slot_mapping, plan=None):
        if plan is None:  # (a caller without a step plan: the reference, which checks the slots itself)
            return reshape_and_cache_torch(k, v, k_cache, v_cache, slot_mapping)
        check_write(k, v, k_cache, v_cache, slot_mapping)
        if plan.keep is not None:
            k, v = k[plan.keep], v[plan.keep]
        copy_to_slots(k, v, k_cache, v_cache, plan.slots)

    def plan_decode(self, block_tables, context_lens, block_size):
        """Once a step: the gathered decode's `DecodePlan` (index, masks) with a single sequence's
        consecutive span (`contiguous_span`). None under torch.compile (no host reads there)."""
        if torch.compiler.is_compiling():
            return None
        span = contiguous_span(block_tables, context_lens, block_size)
        return DecodePlan(block_tables, context_lens, block_size, span)

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale, window=None, sinks_H=None, plan=None):
        if sinks_H is not None or torch.compiler.is_compiling():  # compiled: as traced before (no host checks)
            return paged_attention_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale, window,
                                                sinks_H)
        if plan is None:  # (a caller without a step plan: worked out for this call)
            plan = self.plan_decode(block_tables, context_lens, k_cache.shape[1])
        if plan.span is not None and window is None:  # a single sequence's consecutive blocks: a view
            check_attention(q, k_cache, v_cache, block_tables, context_lens, "paged_attention_decode")
            return decode_contiguous(q, k_cache, v_cache, plan.span[0], plan.span[1], scale)
        return decode_gathered(q, k_cache, v_cache, block_tables, context_lens, scale, self.workspace, window, plan)

    def per_sequence(self, q, block_tables, max_seqlen_q: int, block_size: int) -> bool:
        """Whether a prefill goes one sequence at a time (the class docstring's rule)."""
        S = block_tables.shape[0]
        if S * q.shape[1] * max_seqlen_q * block_tables.shape[1] * block_size > self.max_padded_scores:
            return True
        return q.device.type == "cpu" and (S == 1 or q.shape[0] >= self.loop_min_mean_q * S)

    def prefill(self, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_seqlen_q,
                window=None, sinks_H=None):
        if self.per_sequence(q, block_tables, max_seqlen_q, k_cache.shape[1]):
            return paged_attention_prefill_sdpa(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                                                window, sinks_H)
        return paged_attention_prefill_torch(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                                             max_seqlen_q, window, sinks_H)
