"""`speculative="mtp"` (moe/engine/speculative/mtp.py): the served model's own MTP modules draft.
Greedy outputs equal the plain engine's and a naive loop's (with preemption, chunked prefill and
prefix caching), each round's drafts equal a from-scratch recomputation of DeepSeek-V3's
sequential depths (the caches' rollbacks are exact), every block manager is consistent after every
step, sampled outputs follow the target's distribution, and a model without MTP modules is one
clear error."""


import pytest
import torch

from moe.engine import LLM, SamplingParams
from moe.engine.speculative.mtp import MTPProposer
from moe.errors import ConfigError, RequestError
from tests.engine.speculative.test_decoder import GREEDY, MAX_TOKENS, OPTS, check_blocks, check_engine
from tests.engine.speculative.test_decoder import run_checked as run_decoder_checked
from tests.engine.speculative.test_rejection import ALPHA, chi2_pvalue, sampled_vs_exact


@pytest.fixture(scope="module")
def mtp_model(make_model):
    return make_model(260, seed=3, mtp_depth=2)


@pytest.fixture(scope="module")
def prompts(make_prompts):
    ps = make_prompts([5, 21, 9, 40, 3], seed=7)
    return ps + [ps[3][:36] + [11, 12], [20, 21, 22, 23] * 5]  # a prefix-cache hit; a repetitive prompt


def check_mtp(llm) -> None:
    check_engine(llm)
    running = {s.request_id for s in llm.scheduler.running}
    for p in llm.spec.proposers.values():
        if isinstance(p, MTPProposer):
            assert set(p.tracks) <= running
            for j, bm in enumerate(p.bms):
                shadows = [t.shadows[j] for t in p.tracks.values()]
                check_blocks(bm, shadows)
                for t in p.tracks.values():  # only positions with verified inputs stay in a cache
                    seq = next(s for s in llm.scheduler.running if s.request_id == t.shadows[j].request_id)
                    assert t.shadows[j].num_computed_tokens <= max(seq.num_tokens - 1 - j, 0)


def run_checked(llm, prompts, params):
    return run_decoder_checked(llm, prompts, params, check=check_mtp)


@pytest.mark.parametrize("k", [1, 2, 5], ids=["k1", "k2=depth", "k5_chained"])
def test_greedy_equals_plain_engine_and_naive_loop(k, mtp_model, naive, prompts):
    reference = [naive(mtp_model, p, MAX_TOKENS) for p in prompts]
    assert [o.token_ids for o in LLM.from_model(mtp_model, None, **OPTS).generate(prompts, GREEDY)] == reference
    llm = LLM.from_model(mtp_model, None, speculative={"method": "mtp", "num_tokens": k}, **OPTS)
    outs = run_checked(llm, prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference
    st = llm.stats()
    assert st["num_preemptions"] > 0 and st["prefix_cache_hits"] > 0 and st["kv_blocks_used"] == 0
    assert st["spec_proposed"] > 0 and st["spec_accepted"] <= st["spec_emitted"] <= st["spec_accepted"] + st["spec_steps"]
    # a step accepting anything accepted its first draft, and at most k drafts
    assert st["spec_first_accepted"] <= st["spec_accepted"] <= k * st["spec_first_accepted"]
    assert st["spec_first_acceptance_rate"] == st["spec_first_accepted"] / st["spec_steps"]
    (p,) = llm.spec.proposers.values()
    assert not p.tracks and all(bm.num_free_blocks == bm.num_blocks for bm in p.bms)  # all released


@torch.no_grad()
def naive_drafts(model, ids: list[int], k: int) -> list[int]:
    """DeepSeek-V3's depths recomputed from scratch with plain causal attention: module j at every
    position i < V - 1 reads h^j_i and t_{i+j+1}; past the last module, it reads its own output."""
    V = len(ids)
    x = torch.tensor([ids])
    cos, sin = model.rotary(torch.arange(V + k)[None])
    h = model.embed(x)
    for block in model.layers:
        h = block(h, cos[:, :V], sin[:, :V], x)[0]
    ext, hidden = list(ids), h[:, :V - 1]
    for m in range(k):
        j = min(m, model.mtp.depth - 1)
        n = hidden.shape[1]
        tok = torch.tensor([ext[j + 1:j + 1 + n]])
        out = model.mtp.layers[j](hidden, model.embed(tok), cos[:, :n], sin[:, :n], tok)[0]
        ext.append(int(model.lm_head(model.mtp.layers[j].norm(out[:, -1])).argmax()))
        hidden = out if m + 1 < model.mtp.depth else torch.cat([hidden, out[:, -1:]], dim=1)
    return ext[V:]


def test_every_rounds_drafts_equal_a_from_scratch_recomputation(mtp_model, prompts, monkeypatch):
    """Without prefix caching (a hit leaves h^0 of the cached positions unknown), through
    preemption and chunked prefill: the cached, rolled-back drafting equals the naive one."""
    checked = []
    propose = MTPProposer.propose

    def compare(self, seqs, ks, sample):
        out = propose(self, seqs, ks, sample)
        for s, k, (drafts, _q) in zip(seqs, ks, out):
            if drafts:
                assert drafts == naive_drafts(mtp_model, s.token_ids, k), (s.request_id, s.num_tokens)
                checked.append(k)
        return out

    monkeypatch.setattr(MTPProposer, "propose", compare)
    llm = LLM.from_model(mtp_model, None, speculative={"method": "mtp", "num_tokens": 4},
                         **dict(OPTS, enable_prefix_caching=False))
    run_checked(llm, prompts, GREEDY)
    assert len(checked) > 20 and llm.stats()["num_preemptions"] > 0


def test_a_model_without_mtp_modules_is_one_clear_error(model, mtp_model):
    with pytest.raises(ConfigError, match=r"speculative method 'mtp' .* the served model \(2 layers, d_model=64, "
                                          r"4 experts\) has model.mtp_depth=0"):
        LLM.from_model(model, None, speculative="mtp")
    llm = LLM.from_model(model, None, collect_routing_stats=False)
    with pytest.raises(RequestError, match="model.mtp_depth=0") as e:
        llm.validate_request([5, 6], {"speculative": {"method": "mtp", "num_tokens": 2}})
    assert e.value.param == "speculative"
    with pytest.raises(ConfigError, match="'mtp' is not supported with compile=True"):
        LLM.from_model(mtp_model, None, speculative="mtp", compile=True)


def test_a_request_chooses_mtp_on_an_engine_without_a_default(mtp_model, naive, prompts):
    llm = LLM.from_model(mtp_model, None, collect_routing_stats=False)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, speculative="mtp")
    out = llm.generate(prompts[1], params)[0]
    assert out.token_ids == naive(mtp_model, prompts[1], MAX_TOKENS) and out.metrics.spec_proposed > 0


@pytest.mark.slow
def test_engine_samples_follow_the_target_distribution(make_model):
    """Temperature 1 on a vocabulary of 6, k = 3 > depth 1 (chained): the joint distribution of
    the first three output tokens matches the model's exact one."""
    model = make_model(6, seed=2, init_std=0.3, mtp_depth=1)
    exact, counts, st = sampled_vs_exact(model, {"method": "mtp", "num_tokens": 3}, prompt=[0, 1, 2, 3, 4, 5, 3])
    assert st["spec_proposed"] >= 800 and 0.05 * 800 < st["spec_accepted"] < st["spec_proposed"]
    assert chi2_pvalue(counts, exact, 800) > ALPHA


def test_one_token_module_steps_run_only_the_chosen_experts(mtp_model, prompts, monkeypatch):
    """Each module's runner swaps that module's experts for the chosen-experts loop at one token
    (moe/engine/runner/decode_experts.py), as the served model's decode steps do: a chained draft
    is one token, and the grouped call over every expert cost it ~1.3-1.6x (not the served model's
    experts: those are the main runner's)."""
    from moe.engine.runner import decode_experts

    llm = LLM.from_model(mtp_model, None, speculative={"method": "mtp", "num_tokens": 4}, **OPTS)
    (p,) = llm.spec.proposers.values()
    for runner, module in zip(p.runners, mtp_model.mtp.layers):
        assert runner._experts == [module.block.ffn.experts]
    mtp_weights = {id(m.block.ffn.experts.gate_up_proj) for m in mtp_model.mtp.layers}
    calls = []  # (tokens, whether an MTP module's experts) of every chosen-experts call
    loop = decode_experts.active_experts_dispatch

    def counted(x_TD, experts_TK, weights_TK, gate_up, down):
        calls.append((x_TD.shape[0], id(gate_up) in mtp_weights))
        return loop(x_TD, experts_TK, weights_TK, gate_up, down)
    monkeypatch.setattr(decode_experts, "active_experts_dispatch", counted)
    plain = LLM.from_model(mtp_model, None, **OPTS).generate(prompts[:2], GREEDY)
    calls.clear()
    assert [o.token_ids for o in llm.generate(prompts[:2], GREEDY)] == [o.token_ids for o in plain]
    assert sum(is_mtp for _n, is_mtp in calls) >= 2 and {n for n, _ in calls} == {1}
