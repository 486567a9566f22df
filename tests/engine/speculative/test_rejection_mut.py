"""`draw` and `verify` (moe/engine/speculative/rejection.py): the properties the chi-square tests of
test_rejection.py cannot see, added for the mutation run of docs/results/mutation/run4_engine/:
a seeded request reproduces its tokens whatever else used the global RNG, and the exact
emitted tokens / rows / acceptance counts on the edges (rejection with q given, zero q, p == q)."""

from __future__ import annotations

import torch

from moe.engine import SamplingParams
from moe.engine.speculative import rejection
from moe.engine.speculative.rejection import draw, target_probs, verify


def _draws(seed: int, probs_V: torch.Tensor, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        torch.manual_seed(1000 + i)  # the global RNG moves between draws: a seeded draw must not read it
        out.append(draw(probs_V, g))
    return out


def test_a_seeded_draw_depends_on_its_generator_only():
    probs_V = torch.full((8,), 1 / 8)
    a, b = _draws(3, probs_V, 40), _draws(3, probs_V, 40)
    assert a == b
    assert len(set(a)) > 3  # it is a draw, not a constant
    assert _draws(4, probs_V, 40) != a


def test_target_probs_builds_its_filter_arguments_on_the_logits_device():
    """The meta device stands in for a GPU: the top-k / top-p / min-p tensors handed to the
    sampler's filter must be on the logits' device (a dropped `device=` puts them on the CPU,
    which CUDA kernels refuse), checked by a spy around the filter."""
    seen = []

    def spy(scaled, top_k, top_p, min_p):
        seen.append({t.device.type for t in (scaled, top_k, top_p, min_p)})
        return real(scaled, top_k, top_p, min_p)

    real = rejection.top_k_top_p_min_p_mask
    logits_RV = torch.randn(3, 7, device="meta")
    rejection.top_k_top_p_min_p_mask = spy
    try:
        for params in (SamplingParams(temperature=0.7, top_k=3), SamplingParams(top_p=0.8),
                       SamplingParams(min_p=0.2), SamplingParams(top_k=2, top_p=0.9, min_p=0.1)):
            got = target_probs(logits_RV, params, [()] * 3)
            assert got.device.type == "meta" and got.shape == (3, 7)
    finally:
        rejection.top_k_top_p_min_p_mask = real
    assert seen == [{"meta"}] * 4
