"""`CompiledModelRunner` (`LLM(..., compile=True)`): decode steps with static shapes, compiled.

A step whose batch is all decodes (one token per sequence, no speculative proposals) is padded
to the next batch bucket (on CUDA 1, 2, 4, ... up to `max_num_seqs`; on CPU vLLM's capture sizes, 1, 2,
4, then multiples of 8, up to `cpu_max_batch` (32): `decode_buckets`; larger batches run the eager
step), its block tables to the next context bucket (1, 2, 4, ... blocks up to the width `max_model_len` needs: the longest
sequence's blocks rounded up to a power of two, so a step attends over at most twice its longest
context instead of `max_model_len`), and run through `torch.compile` of the model forward
(`dynamic=False`: one graph per (batch, context) bucket, at most `max_graphs` = len(batch
buckets) x len(context buckets); on CUDA mode "reduce-overhead", which captures CUDA graphs).
Inside the graph the attention writes and decodes through `GraphSafeBackend`: the torch
backend's arithmetic without its host-side reads (the negative-slot check, the contiguous-span
test), which split the graph at every layer; the runner never makes a negative slot. The caches
the graph writes are one tensor per layer slot and K/V, not views of the context's one allocation
(`unaliased_caches`): written graph inputs that alias each other made inductor copy the whole
cache out and back at every layer's write. Up to `gathered_max_batch` the experts run
`gathered_experts` (static shapes) inside the graph, so the step is one graph (on the CPU a batch of one
whose k experts' weights exceed `cpu_selected_min_bytes` runs `selected_experts`: the weights read as views
through an unbacked index, not copied out);
above, the model's own dispatch runs as one opaque op inside the graph on CPU (`opaque_experts`: its per-expert token
counts are data-dependent, the op keeps them out of the trace) and eagerly between graph pieces on
CUDA (the gathered one was slower on CPU at batch 64; every expert on every token, measured too, was
slower at every batch from 2 to 64 and is gone: docs/results/generate/compiled_cpu_1205). Padding rows feed token 0 at position 0,
write their K/V into a scratch block that the block manager never hands out (the cache has one
block more than it manages) and attend to that one slot, so they touch no sequence's cache; their
logits are dropped. A hybrid model (`layout`: one table per KV cache group) pads every group's
tables to the step's context bucket the same way (its window groups' released entries are block 0,
masked by the window). Every other step
(prefill chunks, proposals being verified) runs eagerly, as without compile. On the CPU a bucket's
graph is called without dynamo's guards after its first step (`guard_free.py`: the runner knows
which graph a step needs; 2-13% of the compiled engine's time, docs/results/generate/guard_free_1205).
Greedy outputs equal the eager engine's (tests/engine/runner/test_compiled.py).
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.nn.functional as F

from kernels.paged_attention import copy_to_slots
from kernels.paged_attention.reference import gather_cache
from moe.attention.paged_torch_decode import allowed_keys
from moe.engine.runner.context import AttentionMetadata
from moe.engine.runner.group_tables import with_groups
from moe.engine.runner.guard_free import GuardFreeCalls
from moe.engine.runner.model_runner import ModelRunner
from moe.engine.sequence import ScheduledBatch
from moe.errors import ConfigError
from moe.experts.base import EXPERT_DISPATCH


@torch.library.custom_op("moe_lab::compiled_step_experts", mutates_args=())
def opaque_experts(x_TD: torch.Tensor, experts_TK: torch.Tensor, weights_TK: torch.Tensor, gate_up_E2HD: torch.Tensor,
                   down_EDH: torch.Tensor, dispatch: str) -> torch.Tensor:
    """The registered expert dispatch `dispatch` (the model's own: `sorted`'s grouped GEMMs) as one opaque op
    inside the compiled graph: inductor calls it as an extern kernel, so its data-dependent shapes and host
    read stay out of the trace without splitting the graph (CPU; no CUDA graph could hold its host read)."""
    return EXPERT_DISPATCH.get(dispatch)(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH)


@opaque_experts.register_fake
def _(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH, dispatch):
    return torch.empty_like(x_TD)


def unaliased_caches(context) -> None:
    """Give each (layer slot, K/V) cache its own tensor instead of a view of the context's one allocation.
    The compiled step writes every layer's caches in place; caches that are views of one tensor are aliased
    graph inputs, which AOT autograd merges into one "synthetic base" and inductor then writes each layer's
    K/V by copying the whole cache out and back (measured: 7 full-cache copies a step at batch 8 of the tiny
    model, docs/results/generate/compiled_cpu_1205). Same bytes, same (zero) contents, freed before
    reallocating; layers sharing a slot (a hybrid layout) still share their tensor. `context.kv` is dropped
    (None): nothing in a compiled engine reads it (the parallel runner, which does, refuses compile=True)."""
    if context.fp8 is not None:  # (the fp8 cache keeps its own tensors: kv_fp8.py)
        return
    n_slots, n, shape, dtype, device = *context.kv.shape[:2], context.kv.shape[2:], context.kv.dtype, context.kv.device
    context.k_caches = context.v_caches = context.kv = None
    own = [[torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)] for _ in range(n_slots)]
    context.k_caches = [own[j][0] for j in context.layer_slot]
    context.v_caches = context.k_caches if n == 1 else [own[j][1] for j in context.layer_slot]


def gathered_experts(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH) -> torch.Tensor:
    """Expert dispatch with static shapes (gpt-fast's decode path): each token gathers the
    weights of its k experts; no per-expert token counts, so nothing for the compiler to
    specialise on. Memory T x K x 3HD: meant for decode batches, not prefill."""
    gate, up = torch.einsum("td,tkhd->tkh", x_TD, gate_up_E2HD[experts_TK]).chunk(2, dim=-1)
    out = torch.einsum("tkh,tkdh->tkd", F.silu(gate) * up, down_EDH[experts_TK])
    return (out * weights_TK.unsqueeze(-1).to(out.dtype)).sum(dim=1).to(x_TD.dtype)


def selected_experts(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH) -> torch.Tensor:
    """Expert dispatch for one token inside the graph (the CPU's batch-1 step): each of its k experts'
    weights as a view (`gate_up_E2HD[e]` with `e` read as an unbacked integer: `capture_scalar_outputs`),
    so nothing is copied, where `gathered_experts` first copies the k experts' weights out (2 x 4.7 MB a
    layer at the `small` model's shapes, beyond the core's L2). The eager one-token path's ops
    (`active_experts_dispatch`) in its order: the experts ascending, each added to zeros."""
    K, E = experts_TK.shape[1], gate_up_E2HD.shape[0]
    experts_K, order_K = experts_TK[0].sort()
    weights_K = weights_TK[0][order_K]
    y_TD = torch.zeros_like(x_TD)
    for j in range(K):
        e = experts_K[j].item()
        torch._check(e >= 0)
        torch._check(e < E)  # (a step at inference drops no assignment: only training applies a capacity)
        gate, up = F.linear(x_TD, gate_up_E2HD[e]).chunk(2, dim=-1)
        out = F.linear(F.silu(gate) * up, down_EDH[e])
        y_TD = y_TD + (out * weights_K[j]).to(x_TD.dtype)
    return y_TD


def batch_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, ... below `max_num_seqs`, then `max_num_seqs` (also the context buckets, in blocks)."""
    out, b = [], 1
    while b < max_num_seqs:
        out.append(b)
        b *= 2
    return out + [max_num_seqs]


def decode_buckets(max_batch: int, step: int = 8) -> list[int]:
    """The CPU's batch buckets: 1, 2, 4, then the multiples of `step` below `max_batch`, then `max_batch` (vLLM's
    CUDA-graph capture sizes). Above 8 a power-of-two bucket would pad a batch of 17 to 32 rows, and every padding
    row costs the step its attention and its expert rows; here it pads to 24."""
    return sorted({b for b in (1, 2, 4) if b < max_batch} | set(range(step, max_batch, step)) | {max_batch})


def bucket_of(n: int, buckets: list[int]) -> int:
    """The smallest bucket >= n (n <= buckets[-1])."""
    return next(b for b in buckets if b >= n)


def graph_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale: float) -> torch.Tensor:
    """`paged_attention_decode_matmul` as the compiled step computes it: each sequence's gathered keys and
    values laid out [S, G, L, d] (rows of d contiguous, as the cache stores them) before the matmuls, which
    take the keys as a transposed view. Given the [S, G, d, L] permute the reference's matmul asks for,
    inductor built that layout element by element with scalar index loads: 0.61 ms a layer against 0.39 ms
    at batch 8, contexts 64-128, 4 KV heads of 64 (CPU, one thread; 0.34 against 0.21 ms with heads of 32;
    the same at batch 1; docs/results/generate/floor_1205)."""
    S, H, d = q.shape
    G = k_cache.shape[2]
    k_SGLd = gather_cache(k_cache, block_tables).float().permute(0, 2, 1, 3).contiguous()
    v_SGLd = gather_cache(v_cache, block_tables).float().permute(0, 2, 1, 3).contiguous()
    L = k_SGLd.shape[2]
    scores_SGRL = torch.matmul(q.reshape(S, G, H // G, d).float(), k_SGLd.transpose(-1, -2)) * scale
    scores_SGRL = scores_SGRL.masked_fill(~allowed_keys(context_lens, L, None)[:, None, None, :], float("-inf"))
    return torch.matmul(torch.softmax(scores_SGRL, dim=-1), v_SGLd).reshape(S, H, d).to(q.dtype)


class GraphSafeBackend:
    """The `torch` paged backend as the compiled decode step calls it: the same write and decode
    arithmetic without host reads of tensor values, so the whole attention stays in one graph.
    Its write assumes every slot >= 0 (the reference drops negative slots after a host check;
    `CompiledModelRunner` never makes one: padding rows write to the scratch block); its decode
    is the backend's matmul path (the contiguous fast path reads the table on the host)."""

    name = "torch"  # the same arithmetic: callers that branch on the backend (MLA's latent decode) take its path

    def __init__(self, backend):
        self.inner = backend

    def __getattr__(self, attr):  # anything else (prefill, options) is the wrapped backend's
        return getattr(self.inner, attr)

    @staticmethod
    def write(k, v, k_cache, v_cache, slot_mapping, plan=None):  # (its plan_write makes none)
        copy_to_slots(k, v, k_cache, v_cache, slot_mapping)

    @staticmethod
    def plan_decode(block_tables, context_lens, block_size):
        return None  # (the torch backend's plan reads the tables on the host: a graph break)

    @staticmethod
    def plan_write(slot_mapping):
        return None  # (as plan_decode: the torch backend's looks for negative slots on the host)

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale, window=None, sinks_H=None, plan=None):
        if window is not None or sinks_H is not None:
            return self.inner.decode(q, k_cache, v_cache, block_tables, context_lens, scale, window, sinks_H)
        return graph_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)


class CompiledModelRunner(ModelRunner):
    # Bounds set from interleaved A/Bs against the eager runner on this 2-core CPU (B prompts of 20 tokens, 40 greedy
    # tokens, CPU time of generate(), median of 3; record docs/results/generate/compiled_cpu_1205, under load 2.7-9):
    # with per-layer caches (`unaliased_caches`) the one graph with gathered experts paid 1.48x at batch 1, 1.75x
    # at 2 and 1.46x at 4, but only 0.95-1.16x at 8, where each of its 16 (token, expert) pairs reads its expert's
    # weights (twice the 8 experts' bytes the grouped dispatch reads once); the model's own dispatch as one opaque op
    # in the graph paid 1.06-1.17x at 8 (1.17x and 0.96x at 4 and 1). So on CPU: gathered up to 4, the opaque
    # dispatch above. The compiled step ran up to batch 8 until its steps at 16 and 32 were measured against the
    # eager ones (benchmarks/decode_floor.py, docs/results/generate/buckets_1205): tiny 1.26x and 1.22x, `small`
    # 1.10x at both (at 64: 1.14x and 1.09x, for more graphs: not taken); now up to 32 (issue 32's 32 prompts:
    # the tiny model's compiled engine 1.02x -> 1.11x the eager one; `small`'s 0.99x: its step is its experts' GEMMs,
    # which the graph runs as the eager dispatch, and the workload's longer contexts pad to their bucket). Before
    # the per-layer caches the graph lost from batch 4 (quiet_1205/per_batch_1205.txt: 1.00x at 4, 0.81x at 8) and
    # the bound was 2. Every expert on every token (a static dense dispatch, since removed) lost at 8 (0.54x); inductor options
    # (cpp_wrapper, freezing, mode max-autotune-no-cudagraphs) did not resolve from the default (b8_options); with the
    # guard-free calls, cpp_wrapper gave 1.12x against 1.03x at 8 and 1.72x against 1.61x at 1 (tiny) but nothing on
    # `small` (1.296x vs 1.294x HF) for 40-50% longer cold compiles, so it is not used (generate/cpp_wrapper_1205).
    # On CUDA every bucket compiles (CUDA graphs pay launch overhead there) and gathers up to
    # `gathered_max_batch`; those bounds are unmeasured on a GPU.
    gathered_max_batch = 8
    cpu_gathered_max_batch = 4
    cpu_max_batch = 32
    # Batch 1 on the CPU: the gathered experts copy the token's k experts out first; with the copy in the core's
    # 4 MB L2 that is the cheaper step (tiny model, 2 x 1.6 MB: 0.68 against 0.78 ms for its 4 layers), beyond it
    # reading them in place is (`small`, 2 x 4.7 MB: 7.2 against 8.1 ms for 8 layers; generate/floor_1205)
    cpu_selected_min_bytes = 4 << 20
    unalias_caches = True  # per-layer cache tensors (`unaliased_caches`): no whole-cache copies in the graph
    opaque_dispatch = True  # CPU, above the gathered bound: the model's dispatch as one op in the graph (not pieces)
    guard_free = True  # CPU: a bucket's compiled code called without dynamo's guards after its first step

    def __init__(self, model, num_blocks: int, block_size: int, backend, device, dtype, max_num_seqs: int,
                 max_model_len: int, need_records: bool = True, layout=None):
        spec = getattr(model, "quant_spec", None)  # set by moe.quant.quantize_model
        if spec is not None and spec.enabled:
            # The static decode step calls each layer's full-precision expert dispatch; quantized
            # experts (moe.quant.modules.QuantExperts) have their own forward, not traced here.
            raise ConfigError(f"compile=True is not supported with quantization={spec.scheme!r}: the compiled decode "
                              "step runs full-precision experts only; use compile=False or an unquantized model")
        super().__init__(model, num_blocks + 1, block_size, backend, device, dtype, need_records=need_records,
                         layout=layout)
        self.scratch_block = num_blocks  # the extra block: padding rows write here
        if device.type != "cuda":
            self.gathered_max_batch = min(self.gathered_max_batch, self.cpu_gathered_max_batch)
        if self.unalias_caches:
            unaliased_caches(self.context)
        self.buckets = (batch_buckets(max_num_seqs) if device.type == "cuda"
                        else decode_buckets(min(max_num_seqs, self.cpu_max_batch)))
        self.width = -(-max_model_len // block_size)
        self.context_buckets = batch_buckets(self.width)
        # Only the torch backend reads tensors on the host; other backends (Triton) trace as they are.
        self.graph_backend = GraphSafeBackend(backend) if backend.name == "torch" else backend
        # One graph per (batch, context) bucket: dynamo's per-function recompile limit (8 by default)
        # would otherwise send the later buckets back to eager without a word. Process-wide: raised, never lowered.
        self.max_graphs = len(self.buckets) * len(self.context_buckets)
        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, self.max_graphs)
        self.compile_seconds: dict[tuple[int, int], float] = {}  # (batch, context blocks) -> its first step's wall
        model.rotary.extend(max_model_len)  # (the engine has checked max_model_len against the model's context)
        self.moe_layers = [b.ffn for b in model.layers if b.is_moe]  # (their routers are part of the guard-free key)
        self.experts = [f.experts for f in self.moe_layers]
        self.eager_dispatch = [torch.compiler.disable(e.dispatch) for e in self.experts]
        if device.type == "cpu" and self.opaque_dispatch:
            for i, e in enumerate(self.experts):
                if getattr(e, "dispatch_name", None) and e.dispatch is EXPERT_DISPATCH.get(e.dispatch_name):
                    self.eager_dispatch[i] = (lambda name: lambda x, ex, w, gu, dn: opaque_experts(x, ex, w, gu, dn, name))(
                        e.dispatch_name)
        mode = "reduce-overhead" if device.type == "cuda" else "default"
        self._compiled = torch.compile(self._forward, dynamic=False, mode=mode)
        # Guard-free calls of each bucket's graph once compiled (guard_free.py); on the CPU, where measured
        self.calls = GuardFreeCalls(self._forward) if device.type == "cpu" and self.guard_free else None
        self.num_compiled_steps = 0

    def _forward(self, ids, pos):
        """The model's forward for decode steps, without its data-dependent branches: the rotary
        tables are built to max_model_len up front, the experts run `gathered_experts` (small batches)
        or the eager dispatch outside the graph (`execute` sets which)."""
        m = self.model
        cos, sin = m.rotary.cos[pos], m.rotary.sin[pos]
        x = m.embed(ids)
        for block in m.layers:
            x = block(x, cos, sin, ids, self.context, need_records=False)[0]  # a compiled step reports no records
        return m.lm_head(m.norm(x))[0].float()

    def graph_dispatch(self, P: int, ffn):
        """The experts' dispatch traced into a bucket-P graph (None: the eager one, `eager_dispatch`): up to the
        gathered bound the gathered experts; on the CPU at batch 1 the selected ones instead when the gathered
        copy (the k experts' weights) would exceed `cpu_selected_min_bytes`."""
        if P > self.gathered_max_batch:
            return None
        if P == 1 and self.device.type == "cpu":
            ex = ffn.experts
            copy = ffn.router.top_k * (ex.gate_up_proj[0].numel() + ex.down_proj[0].numel()) * ex.gate_up_proj.element_size()
            if copy > self.cpu_selected_min_bytes:
                return selected_experts
        return gathered_experts

    def applies(self, batch: ScheduledBatch) -> bool:
        # a plain decode of every sequence, not merely one token each: a prefill chunk cut to one token
        # by the step's token budget (or a preempted sequence recomputing) also has n == 1, and its row
        # must not be sampled
        return len(batch.seqs) <= self.buckets[-1] and self._is_plain_decode(batch)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch):
        if not self.applies(batch):
            return super().execute(batch)
        B, bs, scratch = len(batch.seqs), self.block_size, self.scratch_block
        P = bucket_of(B, self.buckets)
        W = bucket_of(max(s.num_computed_tokens // bs + 1 for s in batch.seqs), self.context_buckets)
        ids, pos, slots, lens = [0] * P, [0] * P, [scratch * bs] * P, [1] * P
        for i, seq in enumerate(batch.seqs):
            p = seq.num_computed_tokens
            ids[i], pos[i], lens[i] = seq.token_ids[p], p, p + 1
            slots[i] = seq.block_table[p // bs] * bs + p % bs
        widths = [-(-n // bs) for n in lens[:B]]

        def table_rows(seqs) -> list:
            """Every row's W entries, flat: the blocks its context uses (a windowed sequence's released
            NULL_BLOCK entries as block 0, as block_tables.sync writes them), then the scratch block; then
            the padding rows, all scratch."""
            out = []
            for seq, w in zip(seqs, widths):
                out += [max(b, 0) for b in seq.block_table[:w]] + [scratch] * (W - w)
            return out + [scratch] * ((P - len(seqs)) * W)

        # The step's integers in two tensors (int64: tokens, positions, slots; int32: lengths, tables) and views of
        # them: right after a step's forward has streamed the weights through the caches, each torch call here
        # costs tens of microseconds (docs/results/generate/host_1205), and building each input on its own
        # (a tensor per list, a filled table, its padded rows copied in) made ten of them.
        i64 = self._to_device(torch.tensor(ids + pos + slots, dtype=torch.int64))
        i32 = self._to_device(torch.tensor(lens + table_rows(batch.seqs), dtype=torch.int32))
        empty = self._no_prefill(W)  # (the same tensors at every step of this context bucket)

        def tables(seqs, lo, hi) -> torch.Tensor:  # (another KV group's tables: with_groups)
            return empty[0] if lo == hi else self._to_device(torch.tensor(table_rows(seqs), dtype=torch.int32)).view(P, W)

        meta = AttentionMetadata(
            slot_mapping=i64[2 * P:], num_decodes=P, decode_block_tables=i32[P:].view(P, W),
            decode_context_lens=i32[:P], prefill_block_tables=empty[0], prefill_context_lens=empty[1],
            prefill_cu_seqlens_q=empty[2], prefill_max_seqlen_q=0)
        self.context.meta = with_groups(meta, batch.seqs, [(p, p + 1) for p in pos[:B]], self.num_groups, bs,
                                        tables, self._to_device, slots[B:])
        # the guard-free key: the bucket, and what the model may have swapped since (guard_free.py)
        key = None if self.calls is None else (P, W, id(self.model.rotary.cos), *(id(f.router) for f in self.moe_layers))
        # A captured graph is called without its Python: the dispatch it traced is in it, so the experts' dispatch
        # is swapped only for a step that traces or goes through the guards (each swap and restore is a module
        # attribute write, ~80 us a step here after the weights went through the caches).
        swap = key is None or not self.calls.ready(key)
        own = [e.dispatch for e in self.experts] if swap else None
        if swap:  # small batches: gathered weights inside the graph; above, the model's own dispatch as one op
            for ffn, eager in zip(self.moe_layers, self.eager_dispatch):
                ffn.experts.dispatch = self.graph_dispatch(P, ffn) or eager
        backend, self.context.backend = self.context.backend, self.graph_backend
        first = (P, W) not in self.compile_seconds
        t0 = time.perf_counter()
        try:
            args = i64[:P].view(1, P), i64[P:2 * P].view(1, P)
            with torch._dynamo.config.patch(capture_scalar_outputs=True) if swap else contextlib.nullcontext():
                logits = self._compiled(*args) if key is None else self.calls.call(key, self._compiled, *args)
        finally:
            self.context.meta, self.context.backend = None, backend
            if swap:
                for e, d in zip(self.experts, own):
                    e.dispatch = d
        if first:  # compile time: the first step of a bucket traces and compiles its graph
            self.compile_seconds[(P, W)] = time.perf_counter() - t0
        self.rows_per_seq = [1] * B
        self.num_compiled_steps += 1
        # Routing records would count the padding rows' tokens: a compiled step reports none. On the CPU the graph's
        # output is a fresh tensor each call; CUDA graphs write theirs again at the next replay: a copy.
        if self.device.type == "cuda":
            logits = logits[:B].clone()
        elif B < P:
            logits = logits[:B]
        return logits, list(range(B)), []
