"""Shared fixtures for the data tests: the small real corpora and a small trained tokenizer."""

from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA

CORPUS = SHARED_DATA / "corpus"  # read-only; never copied


@pytest.fixture(scope="session")
def corpus() -> Path:
    if not CORPUS.is_dir():
        pytest.skip(f"shared corpus not found at {CORPUS}")
    return CORPUS


@pytest.fixture(scope="session")
def small_tokenizer(corpus):
    """A 512-token BPE trained on ~200 KB of TinyStories (well under a second)."""
    from moe.data.tokenizer import Tokenizer

    text = (corpus / "tinystories_train_head.txt").read_text(encoding="utf-8")
    return Tokenizer.train(text.split("\n\n"), vocab_size=512)
