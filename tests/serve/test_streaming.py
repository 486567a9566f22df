"""Server-Sent Events framing (moe/serve/streaming.py)."""

from __future__ import annotations

import json

from moe.serve.streaming import sse


def test_an_event_is_one_line_whatever_the_generated_text_holds():
    # Tokens of a byte-level model can decode to any character, including the ones
    # `str.splitlines` (httpx's aiter_lines) breaks lines at; JSON escapes only some of them.
    text = "a\nb\rc\x0bd\x0ce\x1cf\x1dg\x1eh\x85i\u2028j\u2029k é 字"
    event = sse({"choices": [{"text": text}]})
    assert event.endswith("\n\n") and event.startswith("data: ")
    lines = event[:-2].splitlines()
    assert len(lines) == 1  # even by the broadest line-splitting rule
    assert json.loads(lines[0][len("data: "):]) == {"choices": [{"text": text}]}
    assert "é 字" in event  # other non-ASCII text stays as it is
