"""Splitting one forward's experts into chunks that fit the fast tier without changing the sum.

The resident dispatch adds each token's expert outputs into zeros one by one, in ascending
expert order: ((0 + a) + b) + c. Running the experts in chunks (ascending) and summing the chunk
outputs gives (a + b) + c when a token's first two experts share a chunk, which is the same, but
a + (b + c) when a later chunk holds two of them, which float rounding may not be. So a chunk
takes the next expert unless it is full or some token of that expert already had an expert in
an earlier chunk and has one in this chunk too. With top_k <= 2 this is plain chunks of
`n_slots`; with more experts per token, chunks may be smaller than the slots.
"""

from __future__ import annotations

from collections import defaultdict


def exact_chunks(experts_TK: list[list[int]], used: list[int], n_slots: int) -> list[list[int]]:
    """`used`: the forward's experts, ascending; `experts_TK`: each token's experts (host lists)."""
    if len(used) <= n_slots:
        return [used]
    tokens_of = defaultdict(list)
    for t, row in enumerate(experts_TK):
        for e in row:
            tokens_of[e].append(t)
    chunks, current, earlier, in_current = [], [], set(), set()
    for e in used:
        tokens = tokens_of[e]
        if len(current) == n_slots or any(t in earlier and t in in_current for t in tokens):
            chunks.append(current)
            earlier |= in_current
            current, in_current = [], set()
        current.append(e)
        in_current.update(tokens)
    chunks.append(current)
    return chunks
