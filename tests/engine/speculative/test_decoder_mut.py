"""`SpecDecoder` (moe/engine/speculative/decoder.py) piece by piece: the gaps the fifth mutation
run found (docs/results/mutation/run4_engine/README.md). The engine-level tests (test_decoder.py)
check outputs; these check the counters and their ratios, the verification's repetition-penalty
contexts, the drafting draw's distribution and generator, and the refusals' messages."""

from __future__ import annotations

import pytest
import torch

from moe.checkpoint import save_checkpoint
from moe.config import Config, to_dict
from moe.engine import LLM, SamplingParams
from moe.engine.memory.block_manager import BlockManager
from moe.engine.sequence import ScheduledBatch, Sequence
from moe.engine.speculative.decoder import COUNTERS
from moe.engine.speculative.rejection import draw, target_probs
from moe.errors import ConfigError

V = 8
PROMPT = [1, 2]


@torch.no_grad()
def greedy(model, ids: list[int], n: int) -> list[int]:
    """n greedy tokens recomputed from scratch (not the `naive` fixture: its cache is keyed by id(model),
    which a model made inside a test may share with one garbage-collected before it)."""
    ids = list(ids)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-n:]


def spec_decoder(model, **opts):
    return LLM.from_model(model, None, collect_routing_stats=False, block_size=4, num_blocks=32, **opts).spec


def drafted(drafts: list[int], generator=None, **params) -> Sequence:
    """A sequence holding `drafts` as proposals after PROMPT (nothing else set up: `verify` reads
    only the tokens, the params, the draft distribution and the generator)."""
    seq = Sequence("r", None, PROMPT, SamplingParams(**params), 0.0, generator=generator)
    seq.token_ids.extend(drafts)
    seq.num_draft_tokens = len(drafts)
    return seq


def rows(*argmaxes: int) -> torch.Tensor:
    """Logits rows whose argmax is the given token, a clear margin above the rest."""
    lg = torch.zeros(len(argmaxes), V)
    for r, t in enumerate(argmaxes):
        lg[r, t] = 3.0
    return lg


def test_fresh_counters_and_stats_are_zero(model):
    spec = spec_decoder(model, speculative="ngram")
    assert spec.counters == dict.fromkeys(COUNTERS, 0)
    assert spec.stats() == {**dict.fromkeys(COUNTERS, 0), "spec_acceptance_rate": 0.0,
                            "spec_mean_accepted_length": 0.0, "spec_first_acceptance_rate": 0.0}


def test_stats_are_the_counters_and_their_ratios_and_reset_zeroes_them(model):
    spec = spec_decoder(model, speculative="ngram")
    counts = dict(spec_steps=4, spec_proposed=10, spec_accepted=6, spec_emitted=9, spec_first_accepted=3)
    spec.counters = dict(counts)
    assert spec.stats() == {**counts, "spec_acceptance_rate": 0.6, "spec_mean_accepted_length": 1.5,
                            "spec_first_acceptance_rate": 0.75}
    spec.reset_stats()
    assert spec.counters == dict.fromkeys(COUNTERS, 0)
    assert spec.stats()["spec_acceptance_rate"] == 0.0


def test_verify_counts_steps_proposals_acceptances_and_first_acceptances(model):
    spec = spec_decoder(model, speculative="ngram")
    cases = [  # (drafts, logits rows, tokens emitted, drafts accepted)
        ([5, 6, 7], rows(5, 6, 3, 4), [5, 6, 3], 2),
        ([5, 6, 7], rows(5, 6, 3, 4), [5, 6, 3], 2),  # twice: the counters add up, not overwrite
        ([5, 6], rows(4, 6, 1), [4], 0),  # the first proposal rejected
        ([5, 6], rows(5, 2, 1), [5, 2], 1),  # exactly one accepted: a first acceptance
        ([5], rows(5, 7), [5, 7], 1),  # all accepted: the target's bonus token after them
    ]
    seqs = []
    for drafts, lg, want, acc in cases:
        seq = drafted(drafts, temperature=0)
        assert spec.verify(seq, lg) == (want, acc)
        assert seq.token_ids == PROMPT + drafts  # verify reads, roll_back (not here) trims
        seqs.append(seq)
    assert spec.counters == dict(spec_steps=5, spec_proposed=11, spec_accepted=6, spec_emitted=11,
                                 spec_first_accepted=4)
    m = seqs[0].metrics
    assert (m.spec_steps, m.spec_proposed, m.spec_accepted) == (1, 3, 2)
    seq = seqs[3]  # one sequence verified twice: its own metrics add up too
    spec.verify(seq, rows(5, 6, 1))
    assert (seq.metrics.spec_steps, seq.metrics.spec_proposed, seq.metrics.spec_accepted) == (2, 4, 3)


def test_verify_penalises_each_row_by_the_tokens_before_it_drafts_included(model):
    """Row j's repetition penalty looks at the prompt and drafts 0..j-1 (as the sampler would
    after appending them): here draft 5 is only the argmax of row 1 without the penalty on 5, and
    the bonus row's argmax 7 only with drafts 5 and 6 penalised."""
    spec = spec_decoder(model, speculative="ngram")
    lg = torch.zeros(3, V)
    lg[0, 5] = 3.0
    lg[1, 5], lg[1, 6] = 3.0, 2.0  # penalty 2: 5 -> 1.5 < 2.0
    lg[2, 6], lg[2, 7] = 3.0, 2.0  # 6 -> 1.5 < 2.0
    for penalty in (2.0, 3.0):
        seq = drafted([5, 6], temperature=0, repetition_penalty=penalty)
        assert spec.verify(seq, lg) == ([5, 6, 7], 2)
    seq = drafted([5, 6], temperature=0)  # no penalty: row 1 prefers 5 and rejects draft 6
    assert spec.verify(seq, lg) == ([5, 5], 1)


def test_sample_draws_each_row_from_the_processed_target_distribution_with_the_right_generator(model):
    spec = spec_decoder(model, speculative="ngram")
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(0))
    logits[0] = 0.0
    logits[0, 3], logits[0, 4] = 2.0, 1.6  # penalty 1.5 on 3 (in the shadow): 1.33 < 1.6
    seeded = torch.Generator().manual_seed(7)
    seqs = [drafted([], temperature=0, repetition_penalty=1.5),
            drafted([], seeded, temperature=0.8, repetition_penalty=1.5),
            drafted([], temperature=1.0, top_k=3)]
    shadows = [drafted([3]), drafted([3, 4]), drafted([])]
    want_seeded = draw(target_probs(logits[1:2], seqs[1].params, [shadows[1].token_ids])[0],
                       torch.Generator().manual_seed(7))
    own = spec.generator.get_state()
    toks, qs = spec._sample(logits, seqs, shadows)
    # greedy: the penalised argmax (the shadow's last token penalised away), no distribution
    want_greedy = int(target_probs(logits[0:1], seqs[0].params, [shadows[0].token_ids])[0].argmax())
    assert toks[0] == want_greedy and qs[0] is None
    assert want_greedy != int(logits[0].argmax())
    # sampled: the row's own processed distribution, drawn with the request's generator when it has one
    for r in (1, 2):
        want_q = target_probs(logits[r:r + 1], seqs[r].params, [shadows[r].token_ids])[0]
        assert torch.allclose(qs[r], want_q) and qs[r].shape == (V,)
    assert toks[1] == want_seeded
    assert (qs[2] > 0).sum() == 3 and qs[2][toks[2]] > 0
    # the seeded request drew from its own generator, the unseeded one from the engine's
    assert not torch.equal(seeded.get_state(), torch.Generator().manual_seed(7).get_state())
    assert not torch.equal(spec.generator.get_state(), own)
    only_seeded = spec.generator.get_state()
    spec._sample(logits[1:2], seqs[1:2], shadows[1:2])
    assert torch.equal(spec.generator.get_state(), only_seeded)


def test_a_draft_request_without_a_draft_model_is_refused_naming_the_field(model):
    spec = spec_decoder(model, speculative="ngram")
    with pytest.raises(Exception) as e:
        spec.resolve(SamplingParams(speculative={"method": "draft"}))
    assert e.value.param == "speculative" and str(e.value) == (
        "speculative method 'draft' needs the engine's draft model (LLM(..., speculative={'method': 'draft', "
        "'model': ...})); this engine has none")
    with pytest.raises(Exception) as e:  # a bad self config: the proposer's ConfigError, as a RequestError
        spec.resolve(SamplingParams(speculative={"method": "self", "top_k": None}))
    assert e.value.param == "speculative" and "cheaper drafting pass" in str(e.value)


def test_a_draft_model_given_as_a_checkpoint_path_is_loaded_and_drafts(tmp_path, model):
    state = {"model": model.state_dict(), "config": to_dict(Config(model=model.cfg))}
    path = save_checkpoint(tmp_path / "draft.pt", state)
    spec = spec_decoder(model, speculative={"method": "draft", "model": str(path), "num_tokens": 3})
    loaded = spec.draft_model
    assert loaded is not model and not loaded.training
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
    prompt = [20, 21, 22, 23, 20, 21]
    seq = Sequence("d", None, prompt, SamplingParams(temperature=0), 0.0)
    seq.spec = spec.resolve(seq.params)
    seq.num_computed_tokens = seq.num_tokens - 1
    spec.propose([seq], max_model_len=64)
    assert seq.num_draft_tokens == 3 and spec.drafted == [seq]
    assert seq.token_ids[len(prompt):] == greedy(model, prompt, 3)  # the target's own weights: its greedy tokens


def test_the_draft_model_is_moved_to_the_engines_device_and_dtype(model, make_model):
    draft = make_model(260, seed=3).to(torch.bfloat16).train()
    calls = []
    own_to = draft.to
    draft.to = lambda *a, **kw: (calls.append(kw), own_to(*a, **kw))[1]  # a spy: meta stands in for no device
    spec = spec_decoder(model, speculative={"method": "draft", "model": draft})
    assert spec.draft_model is draft and not draft.training
    assert calls == [{"device": torch.device("cpu"), "dtype": torch.float32}]
    assert {p.dtype for p in draft.parameters()} == {torch.float32}


def test_draft_refusals_name_the_field(model, make_model):
    with pytest.raises(ConfigError, match=r"^speculative method 'draft' needs speculative\.model: a checkpoint path "
                                          r"or a Transformer with the served model's tokenizer$"):
        spec_decoder(model, speculative={"method": "draft"})
    with pytest.raises(ConfigError, match=r"^speculative\.model has vocab_size=300 but the served model has 260: "
                                          r"a draft model must share the tokenizer$"):
        spec_decoder(model, speculative={"method": "draft", "model": make_model(300)})


def test_each_drafting_cache_has_a_block_more_per_sequence_than_the_target(model):
    """A shadow holds its k - 1 fed-back proposals beyond the target's tokens: the drafting caches
    get the target's blocks plus one per sequence the engine may run."""
    llm = LLM.from_model(model, None, collect_routing_stats=False, block_size=4, num_blocks=32, max_num_seqs=5,
                         speculative={"method": "self", "top_k": 1})
    (proposer,) = llm.spec.proposers.values()
    assert proposer.bm.num_blocks == 32 + 5


def scheduled_after_forward(bm: BlockManager, rid: str, drafts: list[int], logprobs=None) -> Sequence:
    """PROMPT + 3 verified tokens (the last one not yet computed) and `drafts`, after the step that
    fed the last verified token and the drafts (as the engine leaves it before verification)."""
    seq = Sequence(rid, None, PROMPT + [3, 4, 5], SamplingParams(temperature=0, logprobs=logprobs), 0.0)
    bm.admit(seq, [])
    assert bm.allocate_slots(seq, seq.num_tokens - 1)
    seq.num_computed_tokens = seq.num_tokens - 1
    seq.token_ids.extend(drafts)
    seq.num_draft_tokens = len(drafts)
    assert bm.allocate_slots(seq, len(drafts) + 1)
    seq.num_computed_tokens += len(drafts) + 1
    return seq


def test_verify_drafts_splits_drafted_from_plain_rows_and_reports_non_finite_logits(model):
    """Batch: plain, drafted (3 rows), drafted with a NaN row (2 rows), plain; then a drafted one
    with logprobs. Each drafted sequence gets its own rows, the plain ones' rows go to the sampler."""
    spec = spec_decoder(model, speculative="ngram")
    bm = BlockManager(num_blocks=16, block_size=4)
    plain_a, plain_b = (Sequence(r, None, PROMPT, SamplingParams(), 0.0) for r in ("pa", "pb"))
    good = scheduled_after_forward(bm, "g", [6, 7])
    bad = scheduled_after_forward(bm, "b", [6])
    lp = scheduled_after_forward(bm, "l", [5], logprobs=1)
    batch = ScheduledBatch()
    batch.seqs = [plain_a, good, bad, plain_b, lp]
    logits = torch.cat([rows(1), rows(6, 2, 0), rows(6, 0), rows(2), rows(5, 4)])
    logits[4, 3] = float("nan")
    spec.drafted = [good, bad, lp]
    out, rest, sampled = spec.verify_drafts(batch, logits, [0, 1, 2, 3, 4], [1, 3, 2, 1, 2], bm)
    assert [(n.seq, n.token_ids, n.error) for n in out] == [
        (good, [6, 2], None), (bad, [], "the model produced non-finite logits"), (lp, [5, 4], None)]
    assert out[0].logprobs == [None, None]  # the request asked for none
    want = torch.log_softmax(rows(5, 4), dim=-1)
    assert out[2].logprobs == [{5: pytest.approx(float(want[0, 5]))}, {4: pytest.approx(float(want[1, 4]))}]
    assert sampled == [0, 3] and torch.equal(rest, logits[[0, 6]])
    assert spec.drafted == []
    # rolled back to the verified tokens (the emitted ones are appended by the engine); the NaN one discarded
    assert good.token_ids == bad.token_ids == lp.token_ids == PROMPT + [3, 4, 5]
    assert (good.num_computed_tokens, bad.num_computed_tokens, lp.num_computed_tokens) == (4 + 2, 4, 4 + 2)
    assert good.num_draft_tokens == bad.num_draft_tokens == 0
    # every sampled sequence drafted: nothing left for the sampler; none drafted: the logits as given
    again = scheduled_after_forward(bm, "g2", [6])
    batch.seqs = [again]
    spec.drafted = [again]
    assert spec.verify_drafts(batch, rows(6, 1), [0], [2], bm)[1:] == (None, [])
    batch.seqs = [plain_a, plain_b]
    spec.drafted = [good]  # drafted, but its chunk did not reach its end: not among the sampled
    lg = rows(1, 2)
    out, rest, sampled = spec.verify_drafts(batch, lg, [0, 1], [1, 1], bm)
    assert out == [] and rest is lg and sampled == [0, 1]


REPEATING = [10, 11, 12, 13] * 4  # prompt lookup proposes as many tokens as it is asked for


def running(spec, rid: str, out=(), ids=REPEATING, computed_back: int = 1, **params) -> Sequence:
    """A running request with prompt `ids` and generated tokens `out`, all but `computed_back` computed."""
    seq = Sequence(rid, None, ids, SamplingParams(temperature=0, **params), 0.0)
    seq.token_ids.extend(out)
    seq.spec = spec.resolve(seq.params)
    seq.num_computed_tokens = seq.num_tokens - computed_back
    return seq


def test_propose_drafts_k_within_max_tokens_and_max_model_len_and_only_for_ready_sequences(model):
    spec = spec_decoder(model, speculative={"method": "ngram", "num_tokens": 4})
    full = running(spec, "full", max_tokens=100)  # 16 tokens of 22: room for 4 + 1
    by_tokens = running(spec, "max_tokens", [10, 11], max_tokens=5)  # 2 out: 5 - 2 - 1 = 2 proposals
    one = running(spec, "one", [10, 11, 12], max_tokens=5)  # 3 out: one proposal
    none = running(spec, "none", [10, 11, 12, 13], max_tokens=5)  # 4 out: the last token is the target's
    by_len = running(spec, "max_model_len", ids=REPEATING + [10, 11, 12], max_tokens=100)  # 22 - 19 - 1 = 2
    plain = running(spec, "off", max_tokens=100, speculative="off")
    behind = running(spec, "prefill", computed_back=3, max_tokens=100)  # its prompt not all computed yet
    held = running(spec, "held", [10], max_tokens=100)
    held.num_draft_tokens = 1  # still holds this step's proposal
    seqs = [full, by_tokens, one, none, by_len, plain, behind, held]
    before = {s.request_id: list(s.token_ids) for s in seqs}
    spec.propose(seqs, max_model_len=22)
    drafted = {s.request_id: s.token_ids[len(before[s.request_id]):] for s in seqs}
    assert drafted == {"full": [10, 11, 12, 13], "max_tokens": [12, 13], "one": [13], "none": [],
                       "max_model_len": [13, 10], "off": [], "prefill": [], "held": []}
    assert [s.num_draft_tokens for s in seqs] == [4, 2, 1, 0, 2, 0, 0, 1]
    assert spec.drafted == [full, by_tokens, one, by_len] and full.draft_probs is None


def test_resolve_takes_the_requests_choice_else_the_engines(model):
    spec = spec_decoder(model, speculative={"method": "ngram", "num_tokens": 2})
    # one proposer (and drafting cache) per drafting model, built on first use and kept
    selfp = SamplingParams(speculative={"method": "self", "top_k": 1}).speculative
    first = spec.proposer(selfp)
    assert spec.proposer(selfp) is first and spec.proposer(spec.default) is spec.proposer(spec.default)
    assert spec.resolve(SamplingParams(speculative=selfp)) is selfp and spec.proposers[selfp.key] is first
    assert spec.resolve(SamplingParams()) is spec.default
    assert spec.resolve(SamplingParams(speculative="off")) is None
    own = spec.resolve(SamplingParams(speculative={"method": "ngram", "num_tokens": 5}))
    assert own.num_tokens == 5 and own is not spec.default
    assert spec_decoder(model).resolve(SamplingParams()) is None  # an engine without speculation


def test_take_back_drops_the_proposals_of_drafted_sequences_not_scheduled(model):
    spec = spec_decoder(model, speculative={"method": "self", "top_k": 1, "num_tokens": 2})
    a, b, c = (running(spec, r, max_tokens=100) for r in "abc")
    spec.propose([a, b, c], max_model_len=64)
    (proposer,) = spec.proposers.values()
    assert spec.drafted == [a, b, c] and set(proposer.shadows) == {"a", "b", "c"}
    spec.take_back([a, c], running=[a, b])  # b preempted (not scheduled); c finished (not running)
    assert spec.drafted == [a, c]
    assert (a.num_draft_tokens, b.num_draft_tokens, c.num_draft_tokens) == (2, 0, 2)
    assert b.token_ids == REPEATING and len(a.token_ids) == len(REPEATING) + 2
    assert set(proposer.shadows) == {"a", "b"}  # the drafting cache keeps only running sequences
    spec.forget(a)
    assert set(proposer.shadows) == {"b"}


def test_an_mtp_engine_serves_plain_and_other_method_requests_beside_mtp_ones(make_model):
    """Only the MTP requests' hidden states go to the MTP drafter: a request with speculation off
    and one drafting by prompt lookup in the same batch decode as the plain engine would."""
    mtp_model = make_model(260, seed=3, mtp_depth=1)
    llm = LLM.from_model(mtp_model, None, collect_routing_stats=False, block_size=4, num_blocks=64,
                         speculative={"method": "mtp", "num_tokens": 1})
    prompt = [20, 21, 22, 23] * 3
    specs = [None, "off", {"method": "ngram", "num_tokens": 2}]
    outs = llm.generate([prompt] * 3, [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, speculative=s)
                                       for s in specs])
    assert [o.token_ids for o in outs] == [greedy(mtp_model, prompt, 6)] * 3
    assert outs[0].metrics.spec_proposed > 0 and outs[1].metrics.spec_proposed == 0
    (mtp,) = [p for key, p in llm.spec.proposers.items() if key == ("mtp",)]
    assert mtp.tracks == {}  # every track released at the end


def test_sampled_verification_uses_the_drafts_distribution_and_the_requests_generator(model):
    """Draft 5 has p(5) ~ 0.007 but q(5) = 0.001: accepted with probability min(1, p/q) = 1 (with
    q taken as one-hot it would be 0.007). The draws come from the request's generator when it has
    one, else the engine's; a greedy verification draws nothing."""
    spec = spec_decoder(model, speculative="ngram")
    lg = torch.zeros(2, V)
    lg[0, 5] = -3.0
    q = torch.full((1, V), 0.999 / (V - 1))
    q[0, 5] = 0.001

    def states(*gens):
        return [g.get_state() for g in gens] + [torch.get_rng_state()]

    seeded = torch.Generator().manual_seed(1)
    for seq_gen in (seeded, None):
        seq = drafted([5], seq_gen, temperature=1.0)
        seq.draft_probs = q
        before = states(seeded, spec.generator)
        toks, acc = spec.verify(seq, lg)
        assert acc == 1 and toks[0] == 5 and len(toks) == 2
        after = states(seeded, spec.generator)
        moved = [not torch.equal(a, b) for a, b in zip(before, after)]
        assert moved == ([True, False, False] if seq_gen is seeded else [False, True, False])
    greedy = drafted([5], seeded, temperature=0)
    before = states(seeded, spec.generator)
    assert spec.verify(greedy, rows(5, 2)) == ([5, 2], 1)
    assert all(torch.equal(a, b) for a, b in zip(before, states(seeded, spec.generator)))
