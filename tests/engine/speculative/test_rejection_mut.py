"""`draw` and `verify` (moe/engine/speculative/rejection.py): the properties the chi-square tests of
test_rejection.py cannot see, added for the mutation run of docs/results/mutation/run4_engine/:
a seeded request reproduces its tokens whatever else used the global RNG, and the exact
emitted tokens / rows / acceptance counts on the edges (rejection with q given, zero q, p == q)."""

from __future__ import annotations

import torch

from moe.engine import SamplingParams
from moe.engine.speculative import rejection
from moe.engine.speculative.rejection import draw, target_probs, verify


def _draws(seed: int, probs_V: torch.Tensor, n: int, global_seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        torch.manual_seed(global_seed + i)  # the global RNG moves between draws: a seeded draw must not read it
        out.append(draw(probs_V, g))
    return out


def test_a_seeded_draw_depends_on_its_generator_only():
    probs_V = torch.full((8,), 1 / 8)
    a = _draws(3, probs_V, 40, global_seed=0)
    assert a == _draws(3, probs_V, 40, global_seed=1000)
    assert len(set(a)) > 3  # it is a draw, not a constant
    assert _draws(4, probs_V, 40, global_seed=0) != a


def test_target_probs_builds_its_filter_arguments_on_the_logits_device():
    """The meta device stands in for a GPU: the top-k / top-p / min-p tensors handed to the
    sampler's filter must be on the logits' device (a dropped `device=` puts them on the CPU,
    which CUDA kernels refuse), checked by a spy in place of the filter."""
    seen = []

    def spy(scaled, top_k, top_p, min_p):
        seen.append({t.device.type for t in (scaled, top_k, top_p, min_p)})
        return scaled  # the filter's values are test_rejection*.py's business; a meta sort costs ~1 s

    real = rejection.top_k_top_p_min_p_mask
    logits_RV = torch.randn(3, 7, device="meta")
    rejection.top_k_top_p_min_p_mask = spy
    try:
        got = target_probs(logits_RV, SamplingParams(temperature=0.7, top_k=2, top_p=0.9, min_p=0.1), [()] * 3)
    finally:
        rejection.top_k_top_p_min_p_mask = real
    assert got.device.type == "meta" and got.shape == (3, 7)
    assert seen == [{"meta"}]


def test_greedy_verification_uses_the_argmax_and_no_randomness():
    """Greedy rows that are not one-hot (verify is also called with raw distributions): the bonus
    and the correction are the argmax, and the generator is not advanced (a greedy request must not
    shift the draws of the sampled requests sharing the engine's generator)."""
    p_RV = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3], [0.2, 0.3, 0.5]])
    g = torch.Generator().manual_seed(5)
    state = g.get_state()
    for _ in range(20):
        assert verify(p_RV, [1, 0], None, True, g) == ([1, 0, 2], 3, 2)  # bonus: argmax of the last row
        assert verify(p_RV, [1, 2], None, True, g) == ([1, 0], 2, 1)  # correction: argmax of row 1
    assert torch.equal(g.get_state(), state)


def _verify_run(seed: int, p_RV: torch.Tensor, q_KV, drafts_list: list, global_seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, drafts in enumerate(drafts_list):
        torch.manual_seed(global_seed + i)  # the global RNG moves between calls
        out.append(verify(p_RV, drafts, q_KV, False, g))
    return out


def test_sampled_verification_is_reproducible_from_its_generator():
    """Acceptance tests, residual draws and bonus draws all read the request's generator only."""
    p_RV = torch.softmax(torch.randn(3, 6, generator=torch.Generator().manual_seed(0)), dim=-1)
    q_KV = torch.softmax(torch.randn(2, 6, generator=torch.Generator().manual_seed(1)), dim=-1)
    drafts_list = [[d0, d1] for d0 in range(6) for d1 in range(6)] * 3
    for q in (None, q_KV):
        a = _verify_run(7, p_RV, q, drafts_list, global_seed=0)
        assert a == _verify_run(7, p_RV, q, drafts_list, global_seed=5000)
        assert a != _verify_run(8, p_RV, q, drafts_list, global_seed=0)
        assert {r[2] for r in a} == {0, 1, 2}  # rejections at either row and full acceptances all occur


def test_a_draft_its_proposal_gave_no_mass_is_rejected():
    """q(x) = 0 (a proposer whose recorded distribution disagrees with its draft): rejected, the
    token drawn from the residual max(p - q, 0), never a division by zero."""
    p_RV = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    q_KV = torch.tensor([[0.0, 0.2, 0.8]])  # draft 0 has q = 0; residual = [0.5, 0.3, 0] / 0.8
    g = torch.Generator().manual_seed(0)
    outs = [verify(p_RV, [0], q_KV, False, g) for _ in range(200)]
    assert {(rows, acc) for _, rows, acc in outs} == {(1, 0)}
    assert {out[0] for out, _, _ in outs} == {0, 1}


def test_a_token_the_target_excludes_is_rejected_even_at_u_zero():
    """torch.rand can return exactly 0.0: acceptance is u < p(x) / q(x), so p(x) = 0 never passes."""
    real = torch.rand
    torch.rand = lambda *args, **kwargs: torch.zeros(())
    try:
        p_RV = torch.tensor([[0.0, 0.6, 0.4], [0.3, 0.3, 0.4]])
        out, rows, acc = verify(p_RV, [0], None, False, torch.Generator().manual_seed(0))
        out_q, rows_q, acc_q = verify(p_RV, [0], torch.tensor([[0.5, 0.25, 0.25]]), False,
                                      torch.Generator().manual_seed(0))
    finally:
        torch.rand = real
    assert (rows, acc, rows_q, acc_q) == (1, 0, 1, 0) and out[0] != 0 and out_q[0] != 0


def _verify_with_u(u: float, p_RV, drafts, q_KV, n: int) -> list:
    """`n` verifications with torch.rand pinned to `u` (the other draws still from a generator)."""
    real = torch.rand
    torch.rand = lambda *args, **kwargs: torch.tensor(u)
    try:
        g = torch.Generator().manual_seed(0)
        return [verify(p_RV, drafts, q_KV, False, g) for _ in range(n)]
    finally:
        torch.rand = real


def test_a_residual_of_tiny_mass_is_renormalised_not_flushed_to_zero():
    """p and q differ by 1e-30 only (x = 2 has p/q = 0.5; u = 0.75 rejects it): the residual's one
    token must come out, which needs residual / total, not a product that underflows to zeros."""
    p_RV = torch.tensor([[1.0, 1e-30, 1e-30]])
    q_KV = torch.tensor([[1.0, 0.0, 2e-30]])
    assert {tuple(out) for out, _, _ in _verify_with_u(0.75, p_RV, [2], q_KV, 20)} == {(1,)}


def test_a_rejection_with_an_empty_residual_draws_from_p():
    """p == q up to rounding (p(x) one ulp below q(x), u just below 1 rejects x): the residual is all
    zeros, and the token is then drawn from p itself (both tokens occur), never from 0 / 0."""
    p_RV = torch.tensor([[0.5, 0.49999997]])
    q_KV = torch.tensor([[0.5, 0.5]])
    outs = _verify_with_u(float(torch.tensor(1.0).nextafter(torch.tensor(0.0))), p_RV, [1], q_KV, 40)
    assert {(rows, acc) for _, rows, acc in outs} == {(1, 0)}
    assert {out[0] for out, _, _ in outs} == {0, 1}
