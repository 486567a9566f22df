"""Fixtures of the chat-data tests: the repository's tiny chat set and a tokenizer trained on it."""

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "chat"


@pytest.fixture(scope="session")
def chat_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def chat_tokenizer():
    """A 400-token byte-level BPE trained on the chat set's text (the project's template)."""
    import json

    from moe.data.tokenizer import Tokenizer

    rows = [json.loads(line) for line in (FIXTURES / "messages.jsonl").read_text().splitlines()]
    return Tokenizer.train((m["content"] for r in rows for m in r["messages"]), vocab_size=400)
