import math

import pytest
import torch

from moe.engine.sampling.sampler import (Sampler, SamplingParams, apply_repetition_penalty, top_k_top_p_min_p_mask)
from moe.errors import RequestError

NEG = float("-inf")


def kept(logits, top_k=0, top_p=1.0, min_p=0.0):
    out = top_k_top_p_min_p_mask(torch.tensor([logits]), torch.tensor([top_k]), torch.tensor([top_p]),
                                 torch.tensor([min_p]))
    return [i for i, v in enumerate(out[0].tolist()) if v != NEG]


def test_top_k_keeps_k_best_and_ties():
    assert kept([1.0, 4.0, 3.0, 2.0], top_k=2) == [1, 2]
    assert kept([1.0, 3.0, 3.0, 2.0], top_k=1) == [1, 2]  # ties with the k-th value survive (as HF)
    assert kept([1.0, 4.0, 3.0, 2.0], top_k=0) == [0, 1, 2, 3]
    assert kept([1.0, 4.0, 3.0, 2.0], top_k=-1) == [0, 1, 2, 3]
    assert kept([1.0, 4.0], top_k=10) == [0, 1]


def test_top_p_smallest_set_reaching_p():
    logp = [math.log(p) for p in (0.5, 0.3, 0.15, 0.05)]
    assert kept(logp, top_p=0.5) == [0]
    assert kept(logp, top_p=0.7) == [0, 1]
    assert kept(logp, top_p=0.81) == [0, 1, 2]
    assert kept(logp, top_p=0.1) == [0]  # the most likely token always survives
    assert kept(logp, top_p=1.0) == [0, 1, 2, 3]
    # order does not matter
    assert kept([logp[2], logp[0], logp[3], logp[1]], top_p=0.7) == [1, 3]


def test_min_p_relative_to_best():
    logp = [math.log(p) for p in (0.5, 0.3, 0.15, 0.05)]
    assert kept(logp, min_p=0.2) == [0, 1, 2]  # threshold 0.1
    assert kept(logp, min_p=0.5) == [0, 1]  # threshold 0.25
    assert kept(logp, min_p=0.0) == [0, 1, 2, 3]


def test_top_p_one_and_min_p_boundaries_keep_what_hf_keeps():
    """top_p = 1 removes nothing, also where the mass before a token rounds to 1.0 (a token of
    probability 1 - 1e-44 first): rules out applying the top-p cut at p == 1. min_p removes tokens
    strictly less likely than min_p x the best (HF's `probs < scaled_min_p`): two equally likely
    tokens at min_p = 1 both stay (rules out <=)."""
    assert kept([0.0, -100.0, -100.0], top_p=1.0) == [0, 1, 2]
    assert kept([0.0, 0.0, -1.0], min_p=1.0) == [0, 1]


def test_masks_compose_in_hf_order():
    logp = [math.log(p) for p in (0.4, 0.3, 0.2, 0.1)]
    # top-k 3 renormalises to (4/9, 3/9, 2/9); top-p 0.7 then keeps the first two (4/9 < 0.7 <= 7/9)
    assert kept(logp, top_k=3, top_p=0.7) == [0, 1]
    # rows are independent
    out = top_k_top_p_min_p_mask(torch.tensor([logp, logp]), torch.tensor([1, 0]), torch.tensor([1.0, 0.6]),
                                 torch.tensor([0.0, 0.0]))
    assert (out != NEG).tolist() == [[True, False, False, False], [True, True, False, False]]


def test_repetition_penalty():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    out = apply_repetition_penalty(logits, [[0, 1, 1]], [2.0])
    assert out.tolist() == [[1.0, -4.0, 1.0, 0.5]]
    assert apply_repetition_penalty(logits, [[0]], [1.0]).tolist() == logits.tolist()


def penalised_row(row: list, ctx: list, p: float) -> list:
    """The plain formula on one row: each token of the context once, logit / p if positive, else * p."""
    out = list(row)
    for t in set(ctx):
        out[t] = out[t] / p if out[t] > 0 else out[t] * p
    return out


def test_repetition_penalty_rows_are_independent():
    """Each row by its own context and penalty, whatever the rows before it: an empty context or a
    penalty of 1 in one row must not stop the rows after it (rules out `break` for `continue`)."""
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5], [2.0, -2.0, 1.0, 0.5], [3.0, 1.0, -1.0, 0.25]])
    ctxs, pens = [[], [0, 3], [1, 2, 2]], [2.0, 1.0, 4.0]
    out = apply_repetition_penalty(logits, ctxs, pens)
    assert out.tolist() == [penalised_row(r, c, p) for r, c, p in zip(logits.tolist(), ctxs, pens)]
    assert out[2].tolist() == [3.0, 0.25, -4.0, 0.25]


def test_repetition_penalty_counts_rows_fewer_than_the_vocabulary_width():
    """Counted rows take the all-rows path only when they are all the batch's rows: here 2 of 3 rows
    over a vocabulary of 2 (a check against the vocabulary size instead of the batch size would take it)."""
    from moe.engine.sampling.penalties import TokenCounts
    logits = torch.tensor([[1.0, -1.0], [2.0, 0.5], [4.0, -4.0]])
    ctxs = [[0], [0, 1], [1]]
    counts = [TokenCounts(2, torch.device("cpu")).sync(c) for c in ctxs]
    pens = [2.0, 2.0, 1.0]
    out = apply_repetition_penalty(logits, counts, pens)
    assert out.tolist() == [penalised_row(r, c, p) for r, c, p in zip(logits.tolist(), ctxs, pens)]


def sample(sampler, logits, params, gens=None, ctx=None):
    n = logits.shape[0]
    return sampler.sample(logits, params, gens or [None] * n, ctx or [[]] * n)


def test_greedy_and_penalised_greedy():
    s = Sampler(seed=0)
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0]])
    assert sample(s, logits, [SamplingParams(temperature=0)]).token_ids == [1]
    p = SamplingParams(temperature=0, repetition_penalty=1.5)
    assert sample(s, logits, [p], ctx=[[1]]).token_ids == [2]  # 3/1.5 = 2 < 2.9


def test_sampling_follows_the_distribution():
    s = Sampler(seed=0)
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = probs.log().expand(4000, 4).contiguous()
    toks = sample(s, logits, [SamplingParams(temperature=1.0)] * 4000).token_ids
    freq = torch.bincount(torch.tensor(toks), minlength=4).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03)
    # temperature sharpens: at T=0.25 token 3 dominates
    toks = sample(s, logits[:1000], [SamplingParams(temperature=0.25)] * 1000).token_ids
    assert sum(t == 3 for t in toks) > 600
    # masked tokens are never drawn
    toks = sample(s, logits[:500], [SamplingParams(top_k=2)] * 500).token_ids
    assert set(toks) <= {2, 3}


def test_seeded_requests_are_reproducible_and_batch_independent():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    s = Sampler(seed=0)

    def draw(rows):
        g = [s.new_request_generator(123) if i == 1 else None for i in range(rows)]
        ctx = [[]] * rows
        out = []
        for _ in range(5):
            out.append(s.sample(logits[:rows], [SamplingParams(temperature=1.0)] * rows, g, ctx).token_ids[1])
        return out

    a, b = draw(2), draw(3)
    assert a == b  # the seeded row does not care what else is in the batch
    assert len(set(a)) > 1  # and it is random across steps


def test_logprobs_are_raw_model_logprobs():
    s = Sampler(seed=0)
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.0]])
    ref = torch.log_softmax(logits, -1)[0]
    r = sample(s, logits, [SamplingParams(temperature=0, logprobs=2, repetition_penalty=2.0)], ctx=[[2]])
    tok = r.token_ids[0]
    lp = r.logprobs[0]
    assert set(lp) == {2, 1, tok}
    assert all(lp[t] == pytest.approx(float(ref[t])) for t in lp)
    r = sample(s, logits.expand(2, 4), [SamplingParams(temperature=0, logprobs=0), SamplingParams(temperature=0)])
    assert r.logprobs == [{2: pytest.approx(float(ref[2]))}, None]


def test_every_row_gets_its_own_logprobs_penalty_and_mask():
    """Row by row: a row that asks for no log-probs does not stop the rows after it (rules out
    `break`); a penalty of 2 in every row is applied (the check is for "any penalty != 1"); the
    grammar mask (`logits_mask`) acts on the logits the sampler then reads."""
    s = Sampler(seed=0)
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.0]]).expand(3, 4).contiguous()
    r = sample(s, logits, [SamplingParams(temperature=0), SamplingParams(temperature=0, logprobs=1),
                           SamplingParams(temperature=0, logprobs=0)])
    ref = torch.log_softmax(logits[0], -1)
    assert r.logprobs[0] is None and set(r.logprobs[1]) == {2} and set(r.logprobs[2]) == {2}
    assert r.logprobs[1][2] == pytest.approx(float(ref[2]))
    two = SamplingParams(temperature=0, repetition_penalty=2.0)
    assert sample(s, logits[:2], [two, two], ctx=[[2], [2, 1]]).token_ids == [1, 2]  # 3/2 < 2; 3/2 > 2/2 (unpenalised: [2, 2])
    masked = []

    def mask(lg):  # what a grammar does: forbid tokens in place
        masked.append(lg.shape)
        lg[:, 2] = float("-inf")
    assert s.sample(logits[:1], [SamplingParams(temperature=0)], [None], [[]], mask).token_ids == [1]
    assert masked == [torch.Size([1, 4])]


def test_top_p_alone_and_min_p_alone_restrict_the_draws():
    """Each filter is applied when it is the only one set (rules out requiring both, or testing
    min_p against 1 instead of 0)."""
    s = Sampler(seed=0)
    logits = torch.tensor([0.6, 0.3, 0.06, 0.04]).log().expand(400, 4).contiguous()
    toks = sample(s, logits, [SamplingParams(top_p=0.8)] * 400).token_ids
    assert set(toks) == {0, 1}  # 0.6 < 0.8 <= 0.9: the first two
    toks = sample(s, logits, [SamplingParams(min_p=0.2)] * 400).token_ids
    assert set(toks) == {0, 1}  # threshold 0.2 x 0.6 = 0.12


def test_unseeded_rows_draw_from_the_samplers_own_generator():
    """An engine seed makes unseeded requests reproducible whatever else used torch's global RNG."""
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(5))
    params = [SamplingParams(temperature=1.0)] * 4
    draws = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        s = Sampler(seed=7)
        draws.append([sample(s, logits, params).token_ids for _ in range(5)])
    assert draws[0] == draws[1] and len({tuple(d) for d in draws[0]}) > 1


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.5), ("temperature", float("nan")), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2),
    ("top_k", 2.5), ("min_p", 1.5), ("repetition_penalty", 0.0), ("max_tokens", 0), ("seed", "x"),
    ("stop_token_ids", [-1]), ("stop", [""]), ("logprobs", -1), ("ignore_eos", "yes"),
])
def test_sampling_params_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field) as e:
        SamplingParams(**{field: value})
    assert isinstance(e.value, RequestError) and e.value.param == field  # what a server's 400 points at


# Every message of SamplingParams.validate, whole: (field, bad value, why), each also a bound's edge
MESSAGES = [
    ("temperature", -0.5, "must be >= 0 (0 = greedy)"), ("temperature", True, "must be a finite number"),
    ("temperature", float("inf"), "must be a finite number"), ("temperature", "1", "must be a finite number"),
    ("top_p", 0.0, "must be in (0, 1]"), ("top_p", 1.0001, "must be in (0, 1]"),
    ("top_k", -2, "must be -1 or 0 (off) or a positive int"), ("top_k", True, "must be an int"),
    ("top_k", 2.0, "must be an int"),
    ("min_p", -0.01, "must be in [0, 1]"), ("min_p", 1.01, "must be in [0, 1]"),
    ("repetition_penalty", 0.0, "must be > 0 (1 = off)"), ("repetition_penalty", -1, "must be > 0 (1 = off)"),
    ("seed", True, "must be an int"), ("seed", 1.5, "must be an int"),
    ("max_tokens", 0, "must be >= 1"), ("max_tokens", None, "must be an int"),
    ("stop_token_ids", [-1], "must be a list of non-negative ints"),
    ("stop_token_ids", [True], "must be a list of non-negative ints"),
    ("stop_token_ids", [1.0], "must be a list of non-negative ints"),
    ("stop", [""], "must be a non-empty string or a list of non-empty strings"),
    ("stop", ["a", 3], "must be a non-empty string or a list of non-empty strings"),
    ("stop", "", "must be a non-empty string or a list of non-empty strings"),
    ("ignore_eos", 1, "must be a bool"),
    ("logprobs", -1, "must be None or >= 0"), ("logprobs", 1.0, "must be an int"),
]


@pytest.mark.parametrize("field,value,why", MESSAGES, ids=[f"{f}={v!r}" for f, v, _ in MESSAGES])
def test_every_sampling_params_message_names_the_field_value_and_rule(field, value, why):
    with pytest.raises(RequestError) as e:
        SamplingParams(**{field: value})
    shown = [value] if field == "stop" and isinstance(value, str) else value  # a lone string becomes a list
    assert str(e.value) == f"SamplingParams.{field}={shown!r} {why}" and e.value.param == field


def test_sampling_params_accept_every_bound_they_state():
    """The edge of each stated range is allowed (rules out a strict comparison where the message
    says >= or <=, and the reverse): greedy, top_p 1, top-k off both ways, min_p 0 and 1, ..."""
    for kw in (dict(temperature=0), dict(top_p=1.0), dict(top_p=1e-9), dict(top_k=-1), dict(top_k=0),
               dict(top_k=1), dict(min_p=0.0), dict(min_p=1.0), dict(repetition_penalty=1e-9), dict(seed=0),
               dict(max_tokens=1), dict(logprobs=0), dict(stop_token_ids=[0]), dict(stop_token_ids=0),
               dict(stop="a"), dict(ignore_eos=True)):
        SamplingParams(**kw)
    assert SamplingParams(stop_token_ids=0).stop_token_ids == [0]
    assert SamplingParams(temperature=0).greedy and not SamplingParams(temperature=1e-6).greedy
    assert not SamplingParams(top_k=0).top_k_active and not SamplingParams(top_k=-1).top_k_active
    assert SamplingParams(top_k=1).top_k_active


def test_speculative_request_options_are_checked():
    with pytest.raises(RequestError) as e:
        SamplingParams(speculative={"method": "draft", "model": "x"})
    assert e.value.param == "speculative" and str(e.value).endswith(
        " cannot name a draft model: the draft model is an engine option "
        "(LLM(..., speculative={'method': 'draft', 'model': ...}))")
    with pytest.raises(RequestError) as e:
        SamplingParams(speculative="medusa")
    assert e.value.param == "speculative" and str(e.value).startswith("SamplingParams: ")
    assert SamplingParams(speculative="off").speculative is not None


def test_sampling_params_coerce():
    assert SamplingParams.coerce(None) == SamplingParams()
    assert SamplingParams.coerce({"temperature": 0}).greedy
    assert SamplingParams(stop="x").stop == ["x"] and SamplingParams(stop_token_ids=5).stop_token_ids == [5]
    with pytest.raises(ValueError, match="unknown"):
        SamplingParams.coerce({"temp": 0})
    from dataclasses import fields
    with pytest.raises(RequestError) as e:
        SamplingParams.coerce({"temp": 0, "zz": 1, "top_p": 0.5})
    assert str(e.value) == (f"unknown SamplingParams field(s) ['temp', 'zz']; the fields are "
                            f"{[f.name for f in fields(SamplingParams)]}")
    with pytest.raises(RequestError) as e:
        SamplingParams.coerce(3)
    assert str(e.value) == "sampling params must be a SamplingParams or a dict; got int"
    assert SamplingParams.coerce({"top_p": 0.5}).top_p == 0.5
    q = SamplingParams(top_k=3)
    assert SamplingParams.coerce(q) is q  # re-validated in place, not copied
    p = SamplingParams()
    p.top_p = 3.0  # mutated after construction: caught when the engine re-validates
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams.coerce(p)


def test_top_p_keeps_the_token_that_crosses_p():
    """Top-p keeps the smallest set of most likely tokens whose mass reaches p: the token whose
    addition crosses p is KEPT. Rules out "keep the tokens whose cumulative mass is <= p", which
    drops the crossing token ([0] and [0, 1] below). p sits well inside (0.4, 0.75) and just past
    0.75 so that no rounding of the cumulative sums can decide the case."""
    logp = [math.log(p) for p in (0.4, 0.35, 0.2, 0.05)]
    assert kept(logp, top_p=0.6) == [0, 1]  # cumulative 0.4 < 0.6 <= 0.75: token 1 crosses p
    assert kept(logp, top_p=0.75 + 1e-3) == [0, 1, 2]  # just past 0.75: token 2 is the crossing one
    assert kept(logp, top_p=0.39) == [0]  # the first token alone crosses p


def test_guided_options_are_coerced_into_guided_params():
    """A dict like {"choice": [...]} becomes a GuidedParams (kept, not dropped: an unconstrained
    request would silently ignore the grammar); a bad one is the request's error."""
    from moe.engine.sampling.guided import GuidedParams
    g = SamplingParams(guided={"choice": ["yes", "no"]}).guided
    assert isinstance(g, GuidedParams) and g.choice == ["yes", "no"]
    with pytest.raises(RequestError) as e:
        SamplingParams(guided={"jsn": {}})
    assert e.value.param == "guided"
