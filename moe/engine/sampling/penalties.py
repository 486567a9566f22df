"""Per-sequence token counts for the repetition penalty, kept up to date incrementally.

A request with `repetition_penalty != 1` gets a `TokenCounts` when it is first sampled: a [V]
int32 count of every token id in its context (prompt + output), on the sampler's device. Each
step adds only the tokens appended since the last one (`sync`), so the per-step cost is the
new tokens plus one [rows, V] mask, independent of the context length (the list path of
`apply_repetition_penalty` built a sorted set of the whole context per row per step). Counts,
not a set, so frequency / presence penalties could read the same table.
"""

from __future__ import annotations

from typing import Sequence

import torch


class TokenCounts:
    __slots__ = ("counts_V", "seen_V", "num_tokens")

    def __init__(self, vocab_size: int, device: torch.device):
        self.counts_V = torch.zeros(vocab_size, dtype=torch.int32, device=device)
        self.seen_V = torch.zeros(vocab_size, dtype=torch.bool, device=device)  # counts_V > 0, kept alongside
        self.num_tokens = 0  # leading tokens of the context counted so far

    def sync(self, token_ids: Sequence[int]) -> "TokenCounts":
        """Count `token_ids[num_tokens:]` (recount from scratch if the context got shorter, which
        the engine avoids: it syncs only sequences without speculative proposals)."""
        n = len(token_ids)
        if n < self.num_tokens:
            self.counts_V.zero_()
            self.seen_V.zero_()
            self.num_tokens = 0
        if n > self.num_tokens:
            new = torch.tensor(token_ids[self.num_tokens:], dtype=torch.long).to(self.counts_V.device,
                                                                                 non_blocking=True)
            self.counts_V.index_add_(0, new, torch.ones_like(new, dtype=torch.int32))
            self.seen_V.index_fill_(0, new, True)
            self.num_tokens = n
        return self


def penalty_context(seq, vocab_size: int, device: torch.device):
    """What the sampler's repetition penalty reads for `seq` (no proposals in its tokens): its
    TokenCounts brought up to date (made on first use), or () when it has no penalty."""
    if seq.params.repetition_penalty == 1.0:
        return ()
    if seq.token_counts is None:
        seq.token_counts = TokenCounts(vocab_size, device)
    return seq.token_counts.sync(seq.token_ids)


def recount(token_ids: Sequence[int], vocab_size: int) -> torch.Tensor:
    """The counts from scratch (the reference `TokenCounts` is tested against)."""
    return torch.bincount(torch.tensor(list(token_ids), dtype=torch.long), minlength=vocab_size).to(torch.int32)
