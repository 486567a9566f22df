"""A hybrid model (full and sliding layers: GPT-OSS, Gemma-style) is served with one block table
per KV cache group in one shared pool (moe.engine.memory.hybrid_blocks): the window group frees
what its window passed, the full group keeps everything. Greedy output equals a naive recompute
on prompts + outputs many windows long with chunked prefill, prefix caching, preemption, n-gram
speculation and the compiled decode step; FP8 equals the engine with per-group tables off; the
log-probs equal a full forward; random GPT-OSS HF models equal HF `generate()`. The invariant
checks (tests/conftest.py turns them on) run on every group after every step."""

import pytest
import torch

import moe.engine.core.engine as engine_module
from moe.engine import LLM, SamplingParams
from moe.engine.core.invariants import InvariantError
from moe.engine.memory.block_manager import NULL_BLOCK, BlockManager
from moe.engine.runner.compiled import CompiledModelRunner
from tests.engine.conftest import build_model, naive_greedy, random_prompts
from tests.engine.core.test_logprob_parity import attention_heavy, check_parity
from tests.hf_fixtures import random_ids

WINDOW, BS, MAX_TOKENS = 8, 4, 28
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
OPTS = dict(attention_backend="torch", block_size=BS, collect_routing_stats=False)


def hybrid_model(layer_types=("sliding", "full"), window=WINDOW, seed=4):
    model = build_model(260, seed=seed, n_layers=len(layer_types), layer_types=list(layer_types),
                        sliding_window=window, attention_sinks=True, max_seq_len=128)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-zero sinks (GPT-OSS-like: they start at 0)
        for layer in model.layers:
            layer.attn.sinks.copy_(torch.randn(layer.attn.sinks.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def model():
    return hybrid_model()


@pytest.fixture(scope="module")
def prompts():
    # (the last repeats a 4-token pattern: the n-gram proposer has something to propose)
    return random_prompts([5, 23, 41], seed=7) + [[20, 21, 22, 23] * 6]


@pytest.fixture(scope="module")
def reference(model, prompts):
    return [naive_greedy(model, p, MAX_TOKENS) for p in prompts]


# a sequence holds up to 18 full-group blocks (69 tokens) and <= 4 window-group ones: 4 of them need ~70
CASES = {
    "plain": dict(num_blocks=96),
    "chunked": dict(num_blocks=96, max_num_batched_tokens=7, max_num_seqs=3),
    "preempt": dict(num_blocks=28, max_num_batched_tokens=8),
    "prefix": dict(num_blocks=96, enable_prefix_caching=True),
    "spec": dict(num_blocks=96, speculative="ngram"),
    "spec-preempt-chunked-prefix": dict(num_blocks=30, max_num_batched_tokens=9, speculative="ngram",
                                        enable_prefix_caching=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_equals_naive_recompute(case, model, prompts, reference):
    llm = LLM.from_model(model, None, **OPTS, **CASES[case])
    assert llm.hybrid and llm.sliding_window is None and len(llm.block_manager.groups) == 2
    outs = llm.generate(prompts, GREEDY)
    if "prefix" in case:  # the second pass reads the cached prefixes (every group's)
        outs = llm.generate(prompts, GREEDY)
        assert llm.stats()["prefix_cache_hits"] > 0
    assert [o.token_ids for o in outs] == reference
    st = llm.stats()
    assert st["kv_blocks_used"] == 0  # every group's blocks released at the end
    if "preempt" in case:
        assert st["num_preemptions"] > 0
    if "spec" in case:
        assert st["spec_proposed"] > 0 and st["spec_accepted"] > 0


def test_fp8_cache_equals_the_engine_without_group_tables(model, prompts, monkeypatch):
    """FP8 rounds the K/V, so the reference is the FP8 engine with one table (nothing freed)."""
    opts = dict(OPTS, num_blocks=96, kv_cache_dtype="fp8_e4m3", max_num_batched_tokens=10)
    hybrid = LLM.from_model(model, None, **opts).generate(prompts, GREEDY)
    monkeypatch.setattr(engine_module, "is_hybrid", lambda cfg: False)
    one = LLM.from_model(model, None, **opts)
    assert not one.hybrid
    assert [o.token_ids for o in hybrid] == [o.token_ids for o in one.generate(prompts, GREEDY)]


def test_compiled_decode_step_with_group_tables(model, prompts, reference, monkeypatch):
    """The compiled step's static metadata (every group's tables padded to the context bucket with the
    scratch block); its graph is replaced by the same forward uncompiled to stay cheap (the slow test
    below compiles). The CPU's batch bound (2) is raised to compile the padded batch of 4, as CUDA does."""
    monkeypatch.setattr(CompiledModelRunner, "cpu_max_batch", 8)
    llm = LLM.from_model(model, None, compile=True, num_blocks=96, max_num_seqs=4, max_model_len=80, **OPTS)
    seen = {"released": 0, "lowest": 0}

    def forward(ids, pos):  # the graph's inputs: no table entry negative, though released entries exist
        metas = llm.runner.context.meta.groups
        seen["lowest"] = min(seen["lowest"], *(int(m.decode_block_tables.min()) for m in metas))
        seen["released"] += sum(v.block_table.count(NULL_BLOCK) for s in llm.scheduler.running
                                for v in s.kv_group_tables)
        return llm.runner._forward(ids, pos)

    llm.runner._compiled = forward
    outs = llm.generate(prompts[1:4], GREEDY)  # a batch of 3 padded to 4: one padding row
    assert [o.token_ids for o in outs] == reference[1:4]
    assert llm.runner.num_compiled_steps >= MAX_TOKENS - 1
    # the window group's released entries (NULL_BLOCK, -1) reach the graph as block 0, never as -1
    assert seen["released"] > 0 and seen["lowest"] >= 0, seen


@pytest.mark.slow
def test_compiled_graph_with_group_tables(model, prompts, reference):
    llm = LLM.from_model(model, None, compile=True, num_blocks=96, max_num_seqs=1, max_model_len=80, **OPTS)
    out = llm.generate(prompts[2], GREEDY)[0]
    assert out.token_ids == reference[2] and llm.runner.num_compiled_steps == MAX_TOKENS - 1


def test_logprobs_equal_a_full_forward(prompts):
    """Sharp attention (logits x9): a wrong block in either group's table would move the log-probs."""
    heavy = attention_heavy(hybrid_model(("full", "sliding", "sliding", "full"), seed=5))
    llm = LLM.from_model(heavy, None, num_blocks=64, max_num_batched_tokens=9, **OPTS)
    assert len(llm.block_manager.groups) == 2 and llm.kv_layout.layer_slot == (0, 0, 1, 1)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=0)
    check_parity(llm, heavy, prompts[1:3], params)


def held_per_step(llm, prompt, max_tokens):
    """Blocks the request holds in each group after each step."""
    rid = llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    seq, held = llm.requests[rid], []
    while llm.has_unfinished_requests():
        llm.step()
        held.append(llm.block_manager.num_held_per_group(seq))
    return held[:-1]  # (the last step finished it: its blocks are released)


def test_window_group_stays_bounded_while_the_full_group_grows(model):
    chunk = 4
    llm = LLM.from_model(model, None, num_blocks=64, max_num_batched_tokens=chunk, **OPTS)
    held = held_per_step(llm, random_prompts([10], seed=3)[0], 90)
    full, window = [h[0] for h in held], [h[1] for h in held]
    assert full == sorted(full) and full[-1] == -(-(10 + 89) // BS)
    bound = -(-(WINDOW - 1 + chunk) // BS) + 1
    assert max(window) <= bound and min(window[3:]) >= -(-WINDOW // BS)
    # what the pool has in use is both groups' (the released window blocks went back to it)
    assert llm.stats()["kv_blocks_used"] == 0


def test_unequal_groups_and_the_full_group_first_table(prompts):
    """GPT-OSS-like 1 full : 2 sliding layers: a block holds 2 layer slots (the full group uses one);
    `seq.block_table` is the full group's, never released."""
    model = hybrid_model(("full", "sliding", "sliding"))
    llm = LLM.from_model(model, None, num_blocks=80, max_num_batched_tokens=6, **OPTS)
    assert llm.kv_layout.layers_per_block == 2 and llm.kv_layout.layer_slot == (0, 0, 1)
    assert tuple(llm.runner.context.kv.shape[:3]) == (2, 2, 80)
    rid = llm.add_request(prompts[2], GREEDY)
    seq = llm.requests[rid]
    for _ in range(12):
        llm.step()
    assert NULL_BLOCK not in seq.block_table and NULL_BLOCK in seq.kv_group_tables[0].block_table
    while llm.has_unfinished_requests():
        llm.step()
    assert seq.output_token_ids == naive_greedy(model, prompts[2], MAX_TOKENS)


@pytest.mark.parametrize("case", ["gpt_oss-gqa-alternating", "gpt_oss-mha-yarn-tied"])
def test_gpt_oss_greedy_equals_hf_generate_past_the_window(hf_dirs, case):
    directory, hf = hf_dirs(case)
    prompts = [random_ids(1, 14, 3)[0].tolist(), random_ids(1, 5, 4)[0].tolist()]
    llm = LLM(str(directory), device="cpu", dtype="fp32", block_size=4, num_blocks=40, max_num_batched_tokens=6)
    assert llm.hybrid
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ids = torch.tensor([prompt])
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
        assert out.token_ids == ref[0, len(prompt):].tolist()


@pytest.mark.parametrize("planted, message", [
    ("never_frees", "over the .* its window of 8 and one step need"),
    ("frees_early", "released a block its window still sees .*KV group 1"),
])
def test_invariants_catch_a_window_group_bug(model, prompts, monkeypatch, planted, message):
    """Planted in the window group only (the full group's table is right): the per-group checks see it."""
    real = BlockManager.first_visible_block
    if planted == "never_frees":
        monkeypatch.setattr(BlockManager, "release_out_of_window", lambda self, seq: 0)
    else:  # one block more released than the window allows
        monkeypatch.setattr(BlockManager, "first_visible_block", lambda self, p: real(self, p + BS))
    llm = LLM.from_model(model, None, num_blocks=96, max_num_batched_tokens=4, check_invariants=True, **OPTS)
    with pytest.raises(InvariantError, match=message):
        llm.generate(prompts[2], GREEDY)
