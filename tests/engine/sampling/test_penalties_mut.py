"""`TokenCounts` (moe/engine/sampling/penalties.py) keeps its tables on the device it is given,
added for the mutation run of docs/results/mutation/run4_engine/: the meta device stands in for
a GPU (a dropped `device=` would put them on the CPU, beside CUDA logits)."""

from __future__ import annotations

import torch

from moe.engine.sampling.penalties import TokenCounts, penalty_context
from moe.engine.sampling.sampler import SamplingParams
from moe.engine.sequence import Sequence


def test_token_counts_live_on_the_given_device():
    counts = TokenCounts(9, torch.device("meta"))
    assert counts.counts_V.device.type == counts.seen_V.device.type == "meta"
    assert counts.counts_V.dtype == torch.int32 and counts.seen_V.dtype == torch.bool
    assert counts.counts_V.shape == counts.seen_V.shape == (9,) and counts.num_tokens == 0


def test_penalty_context_counts_on_the_given_device():
    """The counts made on first use and every token synced into them stay on `device`."""
    seq = Sequence("r", None, [1, 2, 2], SamplingParams(repetition_penalty=1.3), 0.0)
    counts = penalty_context(seq, 9, torch.device("meta"))
    assert counts.counts_V.device.type == counts.seen_V.device.type == "meta" and counts.num_tokens == 3
    seq.token_ids.extend([4, 4])
    assert penalty_context(seq, 9, torch.device("meta")) is counts and counts.num_tokens == 5
