"""Crash-proof, strict JSON lines (moe/jsonl.py)."""

from __future__ import annotations

import json
import logging

import pytest

from moe.errors import UserError
from moe.jsonl import dumps_record, read_records, write_json, write_records


def strict(text: str):
    def refuse(c):
        raise AssertionError(f"{c} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_nonfinite_values_become_null_and_are_named():
    line = dumps_record({"step": 3, "train/loss": float("nan"), "val/loss": float("inf"), "x": -float("inf"),
                         "ok": 1.5})
    assert strict(line) == {"step": 3, "train/loss": None, "val/loss": None, "x": None, "ok": 1.5,
                            "nonfinite": {"train/loss": "nan", "val/loss": "inf", "x": "-inf"}}
    assert strict(dumps_record({"step": 1, "a": 2.0})) == {"step": 1, "a": 2.0}  # no flag when all is finite


def test_torn_last_line_is_dropped_with_a_warning_and_a_bad_middle_line_is_an_error(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    write_records(path, [{"step": s, "v": s / 2} for s in range(4)])
    with open(path, "a") as f:
        f.write('{"step": 4, "v"')  # a crash in the middle of a write
    caplog.set_level(logging.WARNING, logger="moe")
    assert [r["step"] for r in read_records(path)] == [0, 1, 2, 3]
    assert "dropping the torn last line 5" in caplog.text
    assert [r["step"] for r in read_records(path, max_step=1)] == [0, 1]
    path.write_text('{"step": 0}\n{"step": 1, "v\n{"step": 2}\n')
    with pytest.raises(UserError, match="line 2 is not valid JSON"):
        read_records(path)
    assert read_records(tmp_path / "missing.jsonl") == []


def test_json_documents_are_strict_and_replaced_atomically(tmp_path):
    path = tmp_path / "summary.json"
    write_json(path, {"final_val_loss": float("nan"), "step": 4})
    assert strict(path.read_text()) == {"final_val_loss": None, "step": 4, "nonfinite": {"final_val_loss": "nan"}}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temp file left behind
