"""`CompiledModelRunner` (`LLM(..., compile=True)`): greedy outputs equal the eager engine's and
the naive loop's, each token's log-prob equals one full fp32 forward's, padding rows leave the
sequences' cache alone, and the static-shape expert dispatch equals the reference loop; decode
steps attend over their context bucket (not max_model_len), one graph per (batch, context) bucket."""

import copy
import warnings

import pytest
import torch

from moe.engine import LLM, SamplingParams
from moe.attention.paged_torch import TorchPagedAttention
from moe.engine.runner.compiled import (CompiledModelRunner, GraphSafeBackend, batch_buckets, bucket_of,
                                       decode_buckets, gathered_experts, graph_decode_attention, opaque_experts,
                                       selected_experts)
from moe.engine.runner.decode_experts import active_experts_dispatch
from moe.experts.loop import loop_dispatch
from moe.experts.sorted import sorted_dispatch
from tests.engine.core.test_logprob_parity import attention_heavy, check_parity


def test_buckets():
    assert batch_buckets(1) == [1]
    assert batch_buckets(6) == [1, 2, 4, 6]
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert [bucket_of(n, [1, 2, 4, 6]) for n in (1, 2, 3, 4, 5, 6)] == [1, 2, 4, 4, 6, 6]


def test_cpu_decode_buckets_are_multiples_of_8_above_4():
    assert decode_buckets(1) == [1] and decode_buckets(2) == [1, 2] and decode_buckets(3) == [1, 2, 3]
    assert decode_buckets(6) == [1, 2, 4, 6] and decode_buckets(8) == [1, 2, 4, 8]
    assert decode_buckets(12) == [1, 2, 4, 8, 12] and decode_buckets(16) == [1, 2, 4, 8, 16]
    assert decode_buckets(32) == [1, 2, 4, 8, 16, 24, 32] and decode_buckets(30) == [1, 2, 4, 8, 16, 24, 30]
    assert decode_buckets(20, step=4) == [1, 2, 4, 8, 12, 16, 20]
    b = decode_buckets(32)
    assert [bucket_of(n, b) for n in (5, 9, 16, 17, 25, 32)] == [8, 16, 16, 24, 32, 32]


def test_graph_safe_backend_equals_torch_backend():
    # the compiled step's write and decode (no host reads) against the torch backend's, on a table that is not
    # contiguous, rows of different lengths and a padding row (scratch block 5, context 1)
    g = torch.Generator().manual_seed(1)
    nb, bs, G, H, d = 6, 4, 2, 4, 8
    caches = [torch.randn(nb, bs, G, d, generator=g) for _ in range(2)]
    ref = TorchPagedAttention()
    k, v = torch.randn(3, G, d, generator=g), torch.randn(3, G, d, generator=g)
    slots = torch.tensor([2 * bs + 1, 0, 5 * bs], dtype=torch.int64)
    mine = [c.clone() for c in caches]
    ref.write(k, v, *caches, slots)
    GraphSafeBackend.write(k, v, *mine, slots)
    assert all(torch.equal(a, b) for a, b in zip(mine, caches))
    q = torch.randn(3, H, d, generator=g)
    tables = torch.tensor([[3, 0, 2, 5], [0, 1, 5, 5], [5, 5, 5, 5]], dtype=torch.int32)
    lens = torch.tensor([10, 5, 1], dtype=torch.int32)
    out = GraphSafeBackend(ref).decode(q, *caches, tables, lens, 0.3)
    for i in range(3):  # each row alone through the backend (row 1 takes its contiguous fast path)
        n = -(-int(lens[i]) // bs)
        want = ref.decode(q[i:i + 1], *caches, tables[i:i + 1, :n], lens[i:i + 1], 0.3)
        assert torch.allclose(out[i:i + 1], want, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 3])
def test_graph_decode_attention_is_the_reference(dtype, group):
    """The compiled step's decode attention (its own layout of the gathered blocks) gives the gather reference's
    output: sequences of one token, inside a block and past several, on shuffled tables padded with a scratch
    block; grouped and plain heads; 16-bit caches attended in fp32; the same compiled (one graph)."""
    from kernels.paged_attention import paged_attention_decode_torch
    g = torch.Generator().manual_seed(group)
    G, d, bs, n_blocks = 2, 16, 4, 12
    lens = [1, 6, 13, 4]
    kc, vc = (torch.randn(n_blocks, bs, G, d, generator=g).to(dtype) for _ in range(2))
    perm = torch.randperm(n_blocks - 1, generator=g).tolist()
    rows = [[perm.pop() for _ in range(-(-n // bs))] for n in lens]
    tables = torch.tensor([r + [n_blocks - 1] * (4 - len(r)) for r in rows], dtype=torch.int32)
    cl = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), G * group, d, generator=g).to(dtype)
    want = paged_attention_decode_torch(q, kc, vc, tables, cl, 0.3).float()
    out = graph_decode_attention(q, kc, vc, tables, cl, 0.3)
    assert out.dtype == dtype and out.shape == q.shape
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.float(), want, **tol)
    torch._dynamo.reset()
    step = torch.compile(graph_decode_attention, fullgraph=True, dynamic=False)
    torch.testing.assert_close(step(q, kc, vc, tables, cl, 0.3).float(), want, **tol)


def test_gathered_dispatch_equals_the_loop():
    g = torch.Generator().manual_seed(0)
    T, D, H, E, K = 7, 16, 24, 5, 2
    x = torch.randn(T, D, generator=g)
    experts = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    weights = torch.rand(T, K, generator=g)
    gate_up, down = torch.randn(E, 2 * H, D, generator=g), torch.randn(E, D, H, generator=g)
    ref = loop_dispatch(x, experts, weights, gate_up, down)
    assert torch.allclose(gathered_experts(x, experts, weights, gate_up, down), ref, atol=1e-4)


@pytest.mark.parametrize("K", [1, 2, 3])
def test_selected_dispatch_is_the_eager_one_token_path(K):
    """`selected_experts` (the CPU's batch-1 step): bit for bit the eager one-token dispatch, whose order it
    keeps (experts ascending, whatever order the router chose them in: with three the sum's order shows),
    and in one graph (fullgraph=True raises on a graph break) with each expert read through an unbacked index."""
    g = torch.Generator().manual_seed(K)
    D, H, E = 16, 24, 6
    x = torch.randn(1, D, generator=g)
    gate_up, down = torch.randn(E, 2 * H, D, generator=g), torch.randn(E, D, H, generator=g)
    for experts in (torch.randperm(E, generator=g)[:K], torch.arange(E - 1, E - 1 - K, -1)):
        experts, weights = experts.view(1, K), torch.rand(1, K, generator=g) * 3
        want = active_experts_dispatch(x, experts, weights, gate_up, down)
        assert torch.equal(selected_experts(x, experts, weights, gate_up, down), want)
        assert torch.allclose(want, loop_dispatch(x, experts, weights, gate_up, down), atol=1e-5)
        torch._dynamo.reset()
        with torch._dynamo.config.patch(capture_scalar_outputs=True):
            step = torch.compile(selected_experts, fullgraph=True, dynamic=False)
            assert torch.allclose(step(x, experts, weights, gate_up, down), want, atol=1e-6)
            other = torch.arange(K).view(1, K)  # other experts, the same graph: read at run time, not traced in
            assert torch.allclose(step(x, other, weights, gate_up, down),
                                  active_experts_dispatch(x, other, weights, gate_up, down), atol=1e-6)


def test_opaque_experts_is_the_dispatch_in_one_graph():
    # the model's dispatch as one custom op: the same output as calling it, and a graph that holds it whole
    # (fullgraph=True raises on a graph break; `sorted` reads a count on the host, which would break it)
    g = torch.Generator().manual_seed(2)
    T, D, H, E, K = 6, 16, 24, 4, 2
    x = torch.randn(T, D, generator=g)
    experts = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    weights = torch.rand(T, K, generator=g)
    gate_up, down = torch.randn(E, 2 * H, D, generator=g), torch.randn(E, D, H, generator=g)
    want = sorted_dispatch(x, experts, weights, gate_up, down)
    assert torch.equal(opaque_experts(x, experts, weights, gate_up, down, "sorted"), want)
    torch._dynamo.reset()
    step = torch.compile(lambda *a: opaque_experts(*a, "sorted") * 2, fullgraph=True, dynamic=False)
    assert torch.allclose(step(x, experts, weights, gate_up, down), want * 2, atol=1e-6)


def test_compiled_runner_caches_are_not_views_of_one_tensor(model):
    # aliased caches make the compiled step copy the whole cache per layer write (unaliased_caches): each layer's
    # K and V are their own tensors, zeroed, of the shape the views had
    eager = LLM.from_model(model, None, max_num_seqs=2, max_model_len=32, collect_routing_stats=False).runner.context
    ctx = LLM.from_model(model, None, compile=True, max_num_seqs=2, max_model_len=32,
                         collect_routing_stats=False).runner.context
    caches = ctx.k_caches + ctx.v_caches
    assert ctx.kv is None and len({c.untyped_storage().data_ptr() for c in caches}) == len(caches) == 2 * model.cfg.n_layers
    assert all(c.shape == caches[0].shape and c.shape[1:] == eager.k_caches[0].shape[1:] for c in caches)
    assert all(c.is_contiguous() and not c.any() for c in caches)


@pytest.mark.slow
def test_compiled_greedy_equals_eager(model, make_prompts, naive, monkeypatch):
    # block_size 4, max_model_len 32: context buckets 1, 2, 4, 8 blocks. Prompts of 3, 6 and 9 tokens decode 9
    # tokens together: every decode step a batch of 3 padded to the bucket of 4 (one padding row), the longest
    # context 10..17 tokens (3 blocks, then 5: context buckets 4 and 8, two graphs). Then one prompt alone (batch 1,
    # the selected experts in the graph; contexts 10..14: bucket 4), then two (batch 2, the gathered experts in the
    # graph; contexts 10..12: bucket 4). The model's attention is made sharp
    # (test_logprob_parity.attention_heavy) so that the log-probs depend on the cached K/V: a table cut short
    # (or a padding row writing into a sequence's blocks) would change them.
    # The CPU gathers experts in the graph up to batch 4; lowered here to 2 so that the batch-4 bucket runs the
    # model's dispatch as the opaque op (opaque_experts), the batch-2 bucket the gathered experts and the batch-1
    # bucket the selected ones: every path.
    monkeypatch.setattr(CompiledModelRunner, "cpu_gathered_max_batch", 2)
    monkeypatch.setattr(CompiledModelRunner, "cpu_selected_min_bytes", 0)  # (this model's experts are small)
    heavy = attention_heavy(copy.deepcopy(model))
    prompts = make_prompts([3, 6, 9], seed=4)
    params = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, logprobs=0)
    opts = dict(block_size=4, max_num_seqs=4, max_model_len=32, collect_routing_stats=False)
    eager = LLM.from_model(heavy, None, **opts).generate(prompts, params)
    llm = LLM.from_model(heavy, None, compile=True, **opts)
    assert llm.runner.context_buckets == [1, 2, 4, 8] and llm.runner.max_graphs == 3 * 4
    assert torch._dynamo.config.recompile_limit >= llm.runner.max_graphs  # no bucket falls back to eager
    outs = check_parity(llm, heavy, prompts, params)  # every token's log-prob vs one full forward (1e-4)
    assert sorted(llm.runner.compile_seconds) == [(4, 4), (4, 8)]
    assert llm.runner.num_compiled_steps == 8  # every step after the prefill
    assert llm.runner.calls.num_direct == 8 - 2  # all but each graph's first step skip dynamo's guards
    assert [o.token_ids for o in outs] == [o.token_ids for o in eager] == [naive(heavy, p, 9) for p in prompts]
    single = make_prompts([9], seed=5)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    out = check_parity(llm, heavy, single, params)[0]
    assert sorted(llm.runner.compile_seconds) == [(1, 4), (4, 4), (4, 8)]
    assert all(t > 0 for t in llm.runner.compile_seconds.values())
    assert out.token_ids == naive(heavy, single[0], 6)
    assert llm.runner.num_compiled_steps == 13 and llm.stats()["kv_blocks_used"] == 0
    assert llm.runner.calls.num_direct == 13 - 3
    pair = make_prompts([9, 10], seed=6)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=0)
    outs = check_parity(llm, heavy, pair, params)
    assert sorted(llm.runner.compile_seconds) == [(1, 4), (2, 4), (4, 4), (4, 8)]
    assert [o.token_ids for o in outs] == [naive(heavy, p, 3) for p in pair]
    assert llm.runner.num_compiled_steps == 13 + 2 and llm.runner.calls.num_direct == 13 + 2 - 4


@pytest.mark.slow
def test_guard_free_steps_follow_what_the_model_swaps(model, make_prompts, naive):
    # The guard-free calls (guard_free.py) are keyed by what may change under an engine: new routers
    # (set_routing on the served model) and new rotary tables (a second engine on the same model past its context,
    # allow_long_context) each send the next step through dynamo's guards (a new graph), not a stale one. (No
    # prefix caching: the cache would serve the prompts' K/V computed under the first routing.)
    model = copy.deepcopy(model)
    prompts = make_prompts([5, 7], seed=8)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    opts = dict(compile=True, max_num_seqs=2, block_size=16, collect_routing_stats=False, enable_prefix_caching=False)
    llm = LLM.from_model(model, None, max_model_len=16, **opts)
    first = [o.token_ids for o in llm.generate(prompts, params)]
    assert first == [naive(model, p, 5) for p in prompts]
    direct = llm.runner.calls.num_direct
    assert direct > 0
    routed = copy.deepcopy(model)  # (naive caches its answers per model object)
    routed.set_routing(top_k=1, drop_experts=[0])
    model.set_routing(top_k=1, drop_experts=[0])
    want = [naive(routed, p, 5) for p in prompts]
    assert want != first  # (the test's point: this routing changes these tokens)
    assert [o.token_ids for o in llm.generate(prompts, params)] == want
    cos = model.rotary.cos
    LLM.from_model(model, None, max_model_len=model.cfg.max_seq_len + 8, allow_long_context=True, **opts)
    assert model.rotary.cos is not cos  # (made by the second engine, which need not run)
    assert [o.token_ids for o in llm.generate(prompts, params)] == want
    assert llm.runner.calls.num_direct > direct
    assert len(llm.runner.calls.direct) == 3  # (one context bucket: block_size 16; three models)


def test_cpu_batches_above_the_bound_run_eagerly(model, make_prompts, naive):
    # on CPU the compiled step stops at cpu_max_batch (32): a batch of 33 decodes takes the eager step (no graph
    # is compiled, so this is cheap), with the same tokens
    assert CompiledModelRunner.cpu_max_batch == 32
    llm = LLM.from_model(model, None, compile=True, max_num_seqs=40, max_model_len=32, collect_routing_stats=False)
    assert llm.runner.buckets == [1, 2, 4, 8, 16, 24, 32] and llm.runner.max_graphs == 7 * 2
    assert llm.runner.gathered_max_batch == CompiledModelRunner.cpu_gathered_max_batch == 4
    prompts = make_prompts([4] * 33, seed=6)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    assert llm.runner.num_compiled_steps == 0 and llm.runner.compile_seconds == {}
    assert [o.token_ids for o in outs] == [naive(model, p, 2) for p in prompts]


def test_one_token_prefill_chunks_are_not_compiled_decodes(model, make_prompts, naive):
    # a token budget of 2 feeds the long prompt one token a step beside the short one's decode: every
    # row has one token, but the long prompt's rows are prefill chunks whose logits must not be sampled
    # (regression: the compiled step took them for decodes and appended a token mid-prompt). The graph
    # is replaced by the same forward uncompiled (what it runs is checked by the slow test above), so
    # this stays cheap.
    prompts = make_prompts([2, 12], seed=3)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    opts = dict(max_num_seqs=2, max_model_len=32, block_size=4, max_num_batched_tokens=2)
    llm = LLM.from_model(model, None, compile=True, **opts)
    llm.runner._compiled = llm.runner._forward
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [naive(model, p, 6) for p in prompts]
    assert llm.runner.num_compiled_steps > 0  # the short prompt's decodes did take the compiled step


def test_compile_with_routing_stats_warns_that_decode_steps_are_not_counted(model):
    with pytest.warns(UserWarning, match="compiled decode steps make no routing records"):
        LLM.from_model(model, None, compile=True, max_num_seqs=2, max_model_len=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LLM.from_model(model, None, compile=True, max_num_seqs=2, max_model_len=16, collect_routing_stats=False)


def _stand_in_engine(model, monkeypatch, check, **opts):
    """A compile=True engine whose graph is replaced by the same forward uncompiled (cheap: no compile), and
    whose `check(batch, ids, pos)` sees every compiled step's inputs and metadata inside that forward; also
    returns the (batch size, logits, rows) of each compiled step."""
    llm = LLM.from_model(model, None, compile=True, collect_routing_stats=False, **opts)
    runner, seen, steps = llm.runner, {}, []

    def forward(ids, pos):
        check(seen["batch"], ids, pos)
        return runner._forward(ids, pos)

    def execute(batch):
        seen["batch"] = batch
        before = runner.num_compiled_steps
        out = CompiledModelRunner.execute(runner, batch)
        if runner.num_compiled_steps > before:
            steps.append((len(batch.seqs), *out[:2]))
        return out

    runner._compiled = forward
    monkeypatch.setattr(runner, "execute", execute)
    return llm, steps


def test_compiled_step_inputs_are_the_decode_rows_then_scratch_padding(model, make_prompts, naive, monkeypatch):
    """What the compiled decode step hands its graph, checked against each sequence's own state (the graph is
    replaced by the forward uncompiled, so no compile): row i of a batch of B is sequence i's last token at its
    position, written to its slot (block_table[p // bs] * bs + p % bs), context p + 1, its table row its first
    ceil((p + 1) / bs) blocks then the scratch block up to the step's context bucket W (the smallest bucket of
    that many blocks); the padding rows up to the batch bucket P feed token 0 at position 0, write to the scratch
    block's first slot and attend to it alone (context 1, every entry scratch): no sequence's block. int64 slots,
    int32 lengths and tables (as the eager runner's); B logits rows. Prompts of 3, 6 and 9 tokens: a batch of 3
    padded to 4, contexts that cross block boundaries (and the context bucket, 4 blocks to 8)."""
    bs = 4
    checked = []

    def check(batch, ids, pos):
        r, meta = llm.runner, llm.runner.context.meta
        B, P = len(batch.seqs), ids.shape[1]
        scratch, buckets = r.scratch_block, r.context_buckets
        assert P == bucket_of(B, r.buckets) and P > B  # (the test's point: a padding row)
        ps = [s.num_computed_tokens for s in batch.seqs]
        need = max(-(-(p + 1) // bs) for p in ps)  # blocks of the longest context
        tables = meta.decode_block_tables
        W = tables.shape[1]
        assert W in buckets and W >= need and (W == buckets[0] or buckets[buckets.index(W) - 1] < need), (W, need)
        assert ids.tolist() == [[s.token_ids[p] for s, p in zip(batch.seqs, ps)] + [0] * (P - B)]
        assert pos.tolist() == [ps + [0] * (P - B)]
        assert meta.slot_mapping.dtype == torch.int64 and meta.decode_context_lens.dtype == tables.dtype == torch.int32
        assert meta.slot_mapping.tolist() == [s.block_table[p // bs] * bs + p % bs for s, p in zip(batch.seqs, ps)] + \
            [scratch * bs] * (P - B)
        assert meta.decode_context_lens.tolist() == [p + 1 for p in ps] + [1] * (P - B)
        want = [s.block_table[:-(-(p + 1) // bs)] for s, p in zip(batch.seqs, ps)]
        assert tables.tolist() == [row + [scratch] * (W - len(row)) for row in want] + [[scratch] * W] * (P - B)
        assert meta.num_decodes == P and meta.prefill_block_tables.shape == (0, W)
        assert meta.prefill_cu_seqlens_q.tolist() == [0] and meta.prefill_max_seqlen_q == 0
        checked.append(W)

    llm, steps = _stand_in_engine(model, monkeypatch, check, block_size=bs, max_num_seqs=4, max_model_len=32)
    prompts = make_prompts([3, 6, 9], seed=4)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=9, ignore_eos=True))
    assert [o.token_ids for o in outs] == [naive(model, p, 9) for p in prompts]
    assert len(checked) == len(steps) == 8 and sorted(set(checked)) == [4, 8]
    for B, logits, rows in steps:  # the padding row's logits dropped
        assert logits.shape == (B, model.cfg.vocab_size) and rows == list(range(B))


def test_cpu_batches_above_8_pad_to_the_next_multiple_of_8(model, make_prompts, naive, monkeypatch):
    # (the graph stood in by the uncompiled forward: no compile) 9 sequences decode in the bucket of 16, 17 in
    # the bucket of 24 (not 32: a padding row costs the step its expert rows), the padding rows' logits dropped
    padded = []
    llm, steps = _stand_in_engine(model, monkeypatch, lambda batch, ids, pos: padded.append((len(batch.seqs), ids.shape[1])),
                                  block_size=4, max_num_seqs=24, max_model_len=32)
    assert llm.runner.buckets == [1, 2, 4, 8, 16, 24] and llm.runner.max_graphs == 6 * 4
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)  # one decode step a call
    for n, P in ((9, 16), (17, 24)):
        padded.clear()
        prompts = make_prompts([3 + i % 5 for i in range(n)], seed=n)
        assert [o.token_ids for o in llm.generate(prompts, params)] == [naive(model, p, 2) for p in prompts]
        assert padded == [(n, P)]
        B, logits, rows = steps[-1]
        assert B == n and logits.shape == (n, model.cfg.vocab_size) and rows == list(range(n))


@pytest.mark.parametrize("ready", [False, True])
def test_the_experts_dispatch_is_swapped_only_when_the_step_traces_or_guards(model, make_prompts, naive, monkeypatch,
                                                                              ready):
    """A step whose bucket's captured code is not ready (`GuardFreeCalls.ready` False: it traces, or goes through
    dynamo's guards) runs with the experts' dispatch swapped (the selected experts at batch 1, gathered experts up
    to the gathered bound), and
    every expert has its own dispatch back after the step; a ready step (the captured graph holds the dispatch it
    traced) swaps nothing: the graph's stand-in (the forward uncompiled) sees the model's own dispatch."""
    experts = [b.ffn.experts for b in model.layers if b.is_moe]
    own = [e.dispatch for e in experts]
    seen = []
    llm, steps = _stand_in_engine(model, monkeypatch, lambda *a: seen.append([e.dispatch for e in experts]),
                                  block_size=4, max_num_seqs=2, max_model_len=32)
    monkeypatch.setattr(llm.runner.calls, "ready", lambda key: ready)
    prompts = make_prompts([3, 5], seed=2)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert [o.token_ids for o in outs] == [naive(model, p, 4) for p in prompts]
    assert len(seen) == len(steps) == 3 and experts
    assert all(d == (own if ready else [gathered_experts] * len(experts)) for d in seen), seen
    assert [e.dispatch for e in experts] == own
    ex = experts[0]
    copy = 2 * (ex.gate_up_proj[0].numel() + ex.down_proj[0].numel()) * 4  # top-2: the gathered copy at batch 1
    for bound, want in ((copy, gathered_experts), (copy - 1, selected_experts)):  # selected when the copy is larger
        monkeypatch.setattr(llm.runner, "cpu_selected_min_bytes", bound)
        seen.clear()
        out = llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]
        assert out.token_ids == naive(model, prompts[0], 3) and len(seen) == 2  # two decode steps of batch 1
        assert all(d == (own if ready else [want] * len(experts)) for d in seen), seen
        assert [e.dispatch for e in experts] == own


def test_no_prefill_tensors_are_made_once_per_context_bucket(model):
    """`_no_prefill(W)`: a decode step's empty prefill metadata (a [0, W] int32 table, its [0] lengths, cu_seqlens
    [0]), made once per context bucket and the very same tensors at every later step of that bucket (no
    allocations a step); another bucket gets its own width."""
    r = LLM.from_model(model, None, compile=True, block_size=4, max_num_seqs=2, max_model_len=32,
                       collect_routing_stats=False).runner
    t4, l4, cu4 = r._no_prefill(4)
    assert t4.shape == (0, 4) and l4.shape == (0,) and cu4.tolist() == [0]
    assert t4.dtype == l4.dtype == cu4.dtype == torch.int32
    t4b, l4b, cu4b = r._no_prefill(4)
    assert t4b is t4 and l4b is l4 and cu4b is cu4
    t8 = r._no_prefill(8)[0]
    assert t8.shape == (0, 8) and r._no_prefill(8)[0] is t8 and r._no_prefill(4)[0] is t4


def test_each_batch_bucket_traces_its_own_experts_dispatch(model, make_prompts, naive, monkeypatch):
    """Which dispatch a tracing step puts in each batch bucket's graph (CPU: gathered bound 4, buckets 1, 2, 4, 8):
    `graph_dispatch` gives the gathered experts up to the bound, the bound itself included, None above it; at
    batch 1 the selected experts only once the gathered copy exceeds `cpu_selected_min_bytes` (this model's
    experts are small: the default 4 MB keeps the gathered ones). A step above the bound traces the runner's
    eager dispatch (`eager_dispatch`: the model's own, as the opaque op), not the gathered experts."""
    experts = [b.ffn.experts for b in model.layers if b.is_moe]
    seen = []
    llm, steps = _stand_in_engine(model, monkeypatch, lambda *a: seen.append([e.dispatch for e in experts]),
                                  block_size=4, max_num_seqs=8, max_model_len=32)
    runner = llm.runner
    monkeypatch.setattr(runner.calls, "ready", lambda key: False)
    assert runner.buckets == [1, 2, 4, 8] and runner.gathered_max_batch == 4
    for ffn in runner.moe_layers:
        assert [runner.graph_dispatch(P, ffn) for P in runner.buckets] == [gathered_experts] * 3 + [None]
    monkeypatch.setattr(runner, "cpu_selected_min_bytes", 0)
    assert all(runner.graph_dispatch(1, ffn) is selected_experts for ffn in runner.moe_layers)
    monkeypatch.setattr(runner, "cpu_selected_min_bytes", CompiledModelRunner.cpu_selected_min_bytes)
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)  # one decode step a call
    for n, want in ((5, runner.eager_dispatch), (3, [gathered_experts] * len(experts)),
                    (2, [gathered_experts] * len(experts)), (1, [gathered_experts] * len(experts))):
        seen.clear()
        prompts = make_prompts([3 + i for i in range(n)], seed=n)
        outs = llm.generate(prompts, params)
        assert [o.token_ids for o in outs] == [naive(model, p, 2) for p in prompts]
        assert seen == [want], (n, seen)
