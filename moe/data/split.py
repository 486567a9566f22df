"""Deterministic train/val split by document.

A document goes to val when a hash of its index (with a fixed seed) falls below
`val_fraction`. Hashing the index, rather than shuffling, makes each document's side
independent of the others: the same corpus always splits the same way, on any machine,
with any numpy version, and a document never lands on both sides.
"""

from __future__ import annotations

import numpy as np

from moe.errors import ConfigError

SPLIT_SEED = 0x5EED_DA7A  # fixed: changing it changes every split (and so every cache key)

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x_N: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a cheap, well-mixed 64-bit hash, vectorised (uint64 wraps)."""
    with np.errstate(over="ignore"):
        z = (x_N + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        return z ^ (z >> np.uint64(31))


def doc_scores(n_docs: int, seed: int = SPLIT_SEED) -> np.ndarray:
    """A uniform score in [0, 1) for each document index, fixed by (index, seed)."""
    return doc_scores_at(np.arange(n_docs, dtype=np.uint64), seed)


def doc_scores_at(idx_N: np.ndarray, seed: int = SPLIT_SEED) -> np.ndarray:
    """The scores of the documents at indices `idx_N` (a stream scores its documents chunk by chunk)."""
    idx_N = np.asarray(idx_N, dtype=np.uint64) ^ np.uint64(seed)
    return (_splitmix64(idx_N) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def split_single_document(text: str, val_fraction: float) -> tuple[str, str]:
    """(train_text, val_text): the head and the tail of one document, cut at a line start.

    A corpus of one document (e.g. a single .txt file such as tinyshakespeare) cannot be
    split by document; the usual fallback is a contiguous tail, which at least keeps the
    two sides from sharing any text. The cut is the first line start after (1 - val_fraction)
    of the characters, else the last one before it, else that exact character.
    """
    if len(text) < 2:
        raise ConfigError(f"the corpus is one document of {len(text)} character(s); too short to split")
    cut = int(len(text) * (1.0 - val_fraction))
    after = text.find("\n", cut, len(text) - 1)  # a newline that leaves a non-empty tail
    before = text.rfind("\n", 0, cut)
    if after != -1:
        cut = after + 1
    elif before != -1:
        cut = before + 1
    cut = min(max(cut, 1), len(text) - 1)  # both sides non-empty
    return text[:cut], text[cut:]


def split_indices(n_docs: int, val_fraction: float, seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """(train_idx, val_idx): sorted document indices; both non-empty.

    When the hash puts every document on one side (small corpora), the document with
    the lowest score moves to val, or the one with the highest to train.
    """
    if n_docs < 2:
        raise ConfigError(f"the corpus has {n_docs} document(s); the train/val split by document needs "
                          "at least 2 (check data.path / data.max_chars)")
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction={val_fraction} must be in (0, 1)")
    score_N = doc_scores(n_docs, seed)
    is_val_N = score_N < val_fraction
    if not is_val_N.any():
        is_val_N[np.argmin(score_N)] = True
    if is_val_N.all():
        is_val_N[np.argmax(score_N)] = False
    return np.flatnonzero(~is_val_N), np.flatnonzero(is_val_N)
