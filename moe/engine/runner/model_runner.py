"""Runs the model on a scheduled batch: builds the flattened inputs and the attention
metadata (positions, slot mapping, block tables, context lengths, cu_seqlens), calls
`model(input_ids, positions=..., kv_context=...)`, and returns the logits of the sequences
that reached their last token (only those rows go through the final norm and LM head).

`need_records=False` (the engine without `collect_routing_stats`: nobody reads the step's routing
records) runs the model's inference routing path, `need_records=False`: no router losses, no
records; the same logits (tests/engine/runner/test_inference_routing.py).
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from moe.attention import PagedAttentionBackend
from moe.engine.runner.block_tables import padded_tables
from moe.engine.runner.context import AttentionMetadata, PagedKVContext
from moe.engine.runner.decode_experts import one_token_experts, swappable_experts
from moe.engine.runner.group_tables import slots_of, with_groups
from moe.engine.sequence import ScheduledBatch


@contextlib.contextmanager
def only_rows(model, rows: torch.Tensor):
    """Feed only hidden-state rows `rows` of the last block to `model.norm` (and so to the LM
    head): both act per token, so this is exact and skips N - len(rows) rows of the LM head.
    (A `logits_indices` argument of `Transformer.forward` would make this hook unnecessary.)"""
    handle = model.norm.register_forward_pre_hook(lambda _mod, args: (args[0][:, rows],))
    try:
        yield
    finally:
        handle.remove()


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int, backend: PagedAttentionBackend,
                 device: torch.device, dtype: torch.dtype, kv_cache_dtype: str = "auto", need_records: bool = True,
                 layout=None):
        """`layout` (a hybrid model's `CacheLayout`): one block table per KV cache group
        (moe.engine.memory.hybrid_blocks); None: one table."""
        cfg = model.cfg
        self.model, self.device, self.block_size = model, device, block_size
        # Only passed when off: draft models (speculative) take the default path and its arguments.
        self.forward_kwargs = {} if need_records else {"need_records": False}
        self.context = PagedKVContext.for_model(cfg, num_blocks, block_size, dtype, device, backend, kv_cache_dtype,
                                                layout)
        self.num_groups = self.context.num_groups
        self.pin = device.type == "cuda"
        self._no_prefill_tensors: dict = {}  # table width -> a decode-only step's empty prefill tensors
        self._experts = swappable_experts(model, device)  # one-token steps run only the chosen experts

    def _to_device(self, data, dtype=None) -> torch.Tensor:
        t = data if isinstance(data, torch.Tensor) else torch.tensor(data, dtype=dtype)
        if self.pin:
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    def _no_prefill(self, width: int) -> tuple:
        """(the [0, width] int32 tables, the [0] context lengths, the [0] cu_seqlens) of a decode-only step's
        absent prefill part: made once per width, then the same tensors at every such step (nothing writes them).
        The eager step's tables have width 0; the compiled step's that of its context bucket."""
        got = self._no_prefill_tensors.get(width)
        if got is None:
            got = self._no_prefill_tensors[width] = (torch.zeros(0, width, dtype=torch.int32, device=self.device),
                                                     torch.zeros(0, dtype=torch.int32, device=self.device),
                                                     torch.zeros(1, dtype=torch.int32, device=self.device))
        return got

    def _is_plain_decode(self, batch: ScheduledBatch) -> bool:
        """Every sequence decodes its last token (one new token each, no speculative proposals):
        each has one logits row, and its row is its token's."""
        return batch.num_decodes == len(batch.seqs) and all(
            s.num_draft_tokens == 0 and s.num_computed_tokens == s.num_tokens - 1 for s in batch.seqs)

    def prepare_decode(self, batch: ScheduledBatch):
        """`prepare` of a plain decode batch (`_is_plain_decode`), the step a running request takes
        over and over: one pass over the sequences, their ids, positions and slots in one host
        tensor, and no prefill part (shared empty tensors)."""
        bs, S = self.block_size, len(batch.seqs)
        ids_pos_slots = [0] * (3 * S)
        context_lens = [0] * S
        for i, seq in enumerate(batch.seqs):
            p = seq.num_computed_tokens
            ids_pos_slots[i] = seq.token_ids[p]
            ids_pos_slots[S + i] = p
            ids_pos_slots[2 * S + i] = seq.block_table[p // bs] * bs + p % bs
            context_lens[i] = p + 1
        self.rows_per_seq = [1] * S
        flat = self._to_device(ids_pos_slots, torch.long)
        empty = self._no_prefill(0)
        meta = AttentionMetadata(
            slot_mapping=flat[2 * S:], num_decodes=S,
            decode_block_tables=self._to_device(padded_tables(batch.seqs, [-(-c // bs) for c in context_lens])),
            decode_context_lens=self._to_device(context_lens, torch.int32),
            prefill_block_tables=empty[0], prefill_context_lens=empty[1], prefill_cu_seqlens_q=empty[2],
            prefill_max_seqlen_q=0)
        if self.num_groups > 1:
            widths = [-(-c // bs) for c in context_lens]
            meta = with_groups(meta, batch.seqs, [(c - 1, c) for c in context_lens], self.num_groups, bs,
                               lambda views, lo, hi: self._to_device(padded_tables(views[lo:hi], widths[lo:hi])),
                               self._to_device)
        return flat[:S].unsqueeze(0), flat[S:2 * S].unsqueeze(0), meta, list(range(S))

    def prepare(self, batch: ScheduledBatch):
        """(input ids [1, N], positions [1, N], the attention metadata, the logits rows)."""
        return self.prepare_decode(batch) if self._is_plain_decode(batch) else self.prepare_general(batch)

    def prepare_general(self, batch: ScheduledBatch):
        """`prepare` of any batch: decodes, prefill chunks, speculative proposals."""
        bs = self.block_size
        self.rows_per_seq: list[int] = []  # logits rows of each batch sequence (1 or 0 without proposals)
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        context_lens: list[int] = []
        q_lens: list[int] = []
        logits_rows: list[int] = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(slots_of(seq.block_table, start, end, bs))
            context_lens.append(end)
            q_lens.append(n)
            # Logits of the last token (when the chunk reaches it), and with speculative proposals at the end
            # of token_ids, of every position from the last verified token on (they verify the proposals).
            first = max(start, seq.num_tokens - 1 - seq.num_draft_tokens)
            rows = range(len(input_ids) - (end - first), len(input_ids)) if end > first else range(0)
            logits_rows.extend(rows)
            self.rows_per_seq.append(len(rows))

        nd = batch.num_decodes
        n_blocks = [-(-c // bs) for c in context_lens]

        def tables(lo, hi) -> torch.Tensor:
            """Block tables of sequences lo..hi, cut to the blocks their contexts use, 0-padded
            (from each sequence's persistent table: moe.engine.runner.block_tables)."""
            return self._to_device(padded_tables(batch.seqs[lo:hi], n_blocks[lo:hi]))

        cu = [0]
        for n in q_lens[nd:]:
            cu.append(cu[-1] + n)
        S = len(batch.seqs)
        meta = AttentionMetadata(
            slot_mapping=self._to_device(slots, torch.int64),
            num_decodes=nd,
            decode_block_tables=tables(0, nd),
            decode_context_lens=self._to_device(context_lens[:nd], torch.int32),
            prefill_block_tables=tables(nd, S),
            prefill_context_lens=self._to_device(context_lens[nd:], torch.int32),
            prefill_cu_seqlens_q=self._to_device(cu, torch.int32),
            prefill_max_seqlen_q=max(q_lens[nd:], default=0),
        )
        spans = [(c - q, c) for c, q in zip(context_lens, q_lens)]
        meta = with_groups(meta, batch.seqs, spans, self.num_groups, bs,
                           lambda views, lo, hi: self._to_device(padded_tables(views[lo:hi], n_blocks[lo:hi])),
                           self._to_device)
        ids = self._to_device(input_ids, torch.long).unsqueeze(0)
        pos = self._to_device(positions, torch.long).unsqueeze(0)
        return ids, pos, meta, logits_rows

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> tuple[Optional[torch.Tensor], list[int], list]:
        """Returns (logits [len(rows), V] fp32 or None, the batch positions of the sampled
        sequences, the step's MoE records)."""
        ids, pos, meta, rows = self.prepare(batch)
        self.context.meta = meta
        # Every token's row wanted (rows are increasing: all of them means all, in order), as in a
        # decode step: no row selection, no hook.
        select = contextlib.nullcontext() if len(rows) == ids.shape[1] else \
            only_rows(self.model, self._to_device(rows, torch.long))
        try:
            with select, one_token_experts(self._experts, ids.shape[1]):
                out = self.model(ids, positions=pos, kv_context=self.context, **self.forward_kwargs)
        finally:
            self.context.meta = None
        # batch index of each sequence with logits rows: those whose chunk reached their end (or their
        # last verified token, with speculative proposals: `rows_per_seq` says how many rows each has)
        sampled = [i for i, c in enumerate(self.rows_per_seq) if c]
        logits = out.logits[0].float() if rows else None
        return logits, sampled, out.moe_records
