"""Rejection sampling (`moe.engine.speculative.rejection`): the emitted tokens follow the target's
distribution whatever the proposal distribution, checked with chi-square tests at fixed seeds,
on the verifier alone and through the engine on a small vocabulary."""

import itertools

import pytest
import torch
from scipy.stats import binomtest, chisquare

from moe.engine import LLM, SamplingParams
from moe.engine.speculative.rejection import target_probs, verify

ALPHA = 1e-3  # a correct sampler fails one of these tests once in a thousand seeds


def chi2_pvalue(counts: dict, probs: dict, n: int) -> float:
    """Chi-square goodness of fit, pooling the cells expected below 5 into one."""
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    for cell, p in probs.items():
        if n * p >= 5:
            obs.append(counts.get(cell, 0))
            exp.append(n * p)
        else:
            rest_o += counts.get(cell, 0)
            rest_e += n * p
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    assert sum(obs) == n, "a sample fell outside the target's support"
    scale = sum(obs) / sum(exp)
    return chisquare(obs, [e * scale for e in exp]).pvalue


@pytest.mark.parametrize("proposal", ["deterministic", "distribution"])
def test_first_two_tokens_follow_the_target(proposal):
    """Two proposals, rows p0 and p1 (p1 stands for the target given the first proposal);
    emitted pairs must follow: first ~ p0, and second ~ p1 when the first equals the proposal."""
    g = torch.Generator().manual_seed(0)
    V, N = 6, 3000
    p = torch.softmax(torch.randn(3, V, generator=g) * 1.5, dim=-1)
    q = torch.softmax(torch.randn(2, V, generator=g) * 1.5, dim=-1)
    firsts, seconds = {}, {}
    for _ in range(N):
        if proposal == "deterministic":
            drafts, qq = [2, 4], None
        else:
            drafts = [int(torch.multinomial(q[j], 1, generator=g)) for j in range(2)]
            qq = q
        out, rows, acc = verify(p, drafts, qq, greedy=False, generator=g)
        assert rows == len(out) and out[:acc] == drafts[:acc]
        firsts[out[0]] = firsts.get(out[0], 0) + 1
        if out[0] == drafts[0] and len(out) > 1:
            seconds[out[1]] = seconds.get(out[1], 0) + 1
    assert chi2_pvalue(firsts, dict(enumerate(p[0].tolist())), N) > ALPHA
    n2 = sum(seconds.values())
    assert n2 > 300
    assert chi2_pvalue(seconds, dict(enumerate(p[1].tolist())), n2) > ALPHA


@pytest.mark.parametrize("proposal", ["deterministic", "distribution"])
def test_acceptance_rate_is_exactly_the_overlap_of_p_and_q(proposal):
    """P(accept) = sum_x min(p(x), q(x)) (min(1, p(x)) for a deterministic proposal x). 20,000
    draws put a 10% bias in the acceptance probability (about 0.05 here) some 14 standard
    deviations away, where the chi-square test of the emitted tokens cannot see it."""
    g = torch.Generator().manual_seed(1)
    N = 20_000
    p = torch.tensor([[0.05, 0.45, 0.2, 0.2, 0.1]])
    q = torch.tensor([[0.3, 0.3, 0.1, 0.2, 0.1]])
    if proposal == "deterministic":
        expected, draws, qq = float(p[0, 2]), [2] * N, None
    else:
        expected = float(torch.minimum(p[0], q[0]).sum())
        draws, qq = torch.multinomial(q[0], N, replacement=True, generator=g).tolist(), q
    accepted = sum(verify(p, [x], qq, greedy=False, generator=g)[2] for x in draws)
    assert binomtest(accepted, N, expected).pvalue > ALPHA, (accepted / N, expected)


def test_the_bonus_token_of_a_sampled_request_is_drawn_from_the_target():
    """Every draft accepted (p gives it probability 1): the extra token comes from the last row's
    distribution, not its argmax."""
    g = torch.Generator().manual_seed(2)
    V, N = 4, 2000
    last = torch.tensor([0.4, 0.3, 0.2, 0.1])
    p = torch.stack([torch.eye(V)[1], torch.eye(V)[3], last])
    bonus = {}
    for _ in range(N):
        out, rows, acc = verify(p, [1, 3], None, greedy=False, generator=g)
        assert (out[:2], rows, acc) == ([1, 3], 3, 2)
        bonus[out[2]] = bonus.get(out[2], 0) + 1
    assert chi2_pvalue(bonus, dict(enumerate(last.tolist())), N) > ALPHA


def test_greedy_accepts_exactly_the_argmax_prefix():
    p = torch.eye(5)[[3, 1, 4]]  # argmax 3, then 1, then 4
    assert verify(p, [3, 1], None, True, None) == ([3, 1, 4], 3, 2)
    assert verify(p, [3, 2], None, True, None) == ([3, 1], 2, 1)
    assert verify(p, [0, 1], None, True, None) == ([3], 1, 0)
    assert verify(p[:2], [3, 1], None, True, None) == ([3, 1], 2, 2)  # the chunk stopped before the bonus row


def test_target_probs_match_the_sampler_processing():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    sp = SamplingParams(temperature=0.5, top_k=2, repetition_penalty=2.0)
    got = target_probs(logits, sp, [[0]])[0]
    # penalty: 2.0 -> 1.0 (token 0 seen); /0.5 -> [2, 2, 1, -2]; top-2 keeps the two ties at 2
    want = torch.softmax(torch.tensor([2.0, 2.0, float("-inf"), float("-inf")]), dim=-1)
    assert torch.allclose(got, want)


@pytest.mark.slow
@pytest.mark.parametrize("spec", [{"method": "self", "top_k": 1, "num_tokens": 2}, {"method": "ngram"}],
                         ids=["self", "ngram"])
def test_engine_samples_follow_the_target_distribution(spec, make_model):
    """Through the engine, temperature 1 on a vocabulary of 6: the joint distribution of the
    first three output tokens under speculation matches the model's exact one."""
    model = make_model(6, seed=2, init_std=0.3)
    exact, counts, st = sampled_vs_exact(model, spec, prompt=[0, 1, 2, 3, 4, 5, 3])  # every token occurs:
    assert st["spec_proposed"] >= 800 and 0.1 * 800 < st["spec_accepted"] < st["spec_proposed"]  # n-gram hits
    assert chi2_pvalue(counts, exact, 800) > ALPHA


def sampled_vs_exact(model, spec, prompt: list[int], n_out: int = 3, N: int = 800) -> tuple[dict, dict, dict]:
    """The model's exact joint distribution of `n_out` tokens after `prompt` (every sequence
    enumerated: a vocabulary of a few tokens), the counts of N engine samples at temperature 1
    with speculation `spec`, and the engine's stats."""
    V = model.cfg.vocab_size
    exact = {}
    with torch.no_grad():
        for seq in itertools.product(range(V), repeat=n_out):
            ids = torch.tensor([prompt + list(seq)])
            lp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
            exact[seq] = float(sum(lp[len(prompt) - 1 + j, seq[j]] for j in range(n_out)).exp())
    llm = LLM.from_model(model, None, seed=0, speculative=spec, max_num_seqs=N, collect_routing_stats=False)
    outs = llm.generate([prompt] * N, SamplingParams(temperature=1.0, max_tokens=n_out, ignore_eos=True))
    counts = {}
    for o in outs:
        counts[tuple(o.token_ids)] = counts.get(tuple(o.token_ids), 0) + 1
    return exact, counts, llm.stats()
