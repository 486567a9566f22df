"""Server-Sent Events framing (moe/serve/streaming.py)."""

from __future__ import annotations

import json

import pytest

from moe.serve.streaming import MAX_JSON_DEPTH, json_nesting_depth, sse


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


@pytest.mark.parametrize("text,depth", [
    ('{"a": [[1, 2], {"b": []}]}', 4),
    ('{"a": "[[[[{{{{", "b": [1]}', 2),  # brackets inside strings do not count
    ('{"a": "a \\" quote [[[[", "b": [[1]]}', 3),  # nor after an escaped quote inside a string
    ('{"a": "back\\\\", "b": [[[1]]]}', 4),  # an escaped backslash ends before the closing quote
    ("1", 0),
])
def test_json_nesting_depth_counts_arrays_and_objects_outside_strings(text, depth):
    body = text.encode()
    assert json.loads(body) is not None  # each case is valid JSON
    # at its own depth a body is within the limit (scanned, or too few brackets to be deeper) ...
    assert json_nesting_depth(body, stop_above=depth) == depth
    if depth:  # ... and one level less is over it, found by the scan
        assert json_nesting_depth(body, stop_above=depth - 1) == depth


def test_json_nesting_depth_exact_when_scanned():
    body = b'{"a": "[[[[", "b": [[{"c": ["]]]]"]}]]}'
    assert body.count(b"[") + body.count(b"{") > 4  # so the scan runs
    assert json_nesting_depth(body, stop_above=4) == 5


def test_json_nesting_depth_stops_past_the_limit():
    deep = b"[" * 100_000 + b"]" * 100_000
    assert json_nesting_depth(deep, MAX_JSON_DEPTH) == MAX_JSON_DEPTH + 1
