"""Every cell of the engine's feature matrix (tests/engine/feature_matrix.py) has the outcome
docs/design/feature_matrix.md records: 'works' (greedy outputs equal the setting's reference,
the option exercised) or 'refused' at creation with a message naming both options. No cell may
fail mid-generation or change an output; the `compile` column is slow (torch.compile)."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

from tests.engine import feature_matrix as fm

CALIB = "calib.txt"
ROWS = [s.name for s in fm.settings(CALIB)]
MODEL_ROWS = {s.name for s in fm.settings(CALIB) if s.model}  # their own architecture (MLA, window + sinks)
COLS = fm.executions(None)


def documented() -> dict:
    """(setting, execution) -> outcome, from the doc's table."""
    lines = [ln for ln in fm.doc_table().splitlines() if ln.startswith("| ")]
    cols = [c.strip() for c in lines[0].strip("|").split("|")][1:]
    out = {}
    for ln in lines[1:]:
        cells = [c.strip().strip("*").lower() for c in ln.strip("|").split("|")]
        for col, outcome in zip(cols, cells[1:]):
            out[(cells[0], col)] = outcome
    return out


def test_the_doc_table_lists_every_cell_and_none_fails():
    doc = documented()
    assert set(doc) == {(r.lower(), c.name) for r in ROWS for c in COLS}
    assert set(doc.values()) <= {"works", "refused"}


def test_the_record_has_every_cell_of_the_table_with_its_times():
    """docs/results/feature_matrix/matrix.json (the last full run) agrees with the doc's table cell by
    cell, and times each cell (wall and CPU seconds: the doc quotes the compile column's)."""
    import json

    cells = json.loads(fm.RECORD.read_text())["cells"]
    assert {(c["setting"].lower(), c["execution"]): c["outcome"].lower() for c in cells} == documented()
    assert all(c["seconds"] >= 0 and c["cpu_seconds"] >= 0 for c in cells)  # rounded to 10 ms: a refusal can be 0
    assert min(c["seconds"] for c in cells if c["execution"] == "compile" and c["outcome"] == "works") > 0


@pytest.fixture(scope="module")
def matrix_model(bpe_tok):
    return fm.make_model(bpe_tok.vocab_size, seed=1)


@pytest.fixture(scope="module")
def rows(matrix_model, bpe_tok, tmp_path_factory):
    """Per setting: its prepared model and reference outputs (built on first use)."""
    calib = tmp_path_factory.mktemp("calib") / CALIB
    calib.write_text(fm.CALIB_TEXT)
    settings = {s.name: s for s in fm.settings(str(calib))}
    cache: dict = {}

    def get(name):
        if name not in cache:
            s = settings[name]
            prepared = fm.prepare(matrix_model, bpe_tok, s)
            cache[name] = (s, prepared, fm.reference_outputs(prepared, bpe_tok, s))
        return cache[name]
    return get


@pytest.fixture(scope="module")
def columns(bpe_tok):
    return {e.name: e for e in fm.executions(fm.make_model(bpe_tok.vocab_size, seed=7))}


# torch.compile costs 5-15 s a cell on 2 CPU cores: the suite compiles for these rows (each kind:
# plain, request options together, refusals; a refused cell costs nothing); MOE_LAB_FULL_MATRIX=1 (or `python -m
# tests.engine.feature_matrix`, which rewrites the doc's table) runs the compile column for every row.
# The rows with their own architecture run the single-option columns in the suite (each is a new
# model and engine per cell, ~1 s); the pairs of options run with MOE_LAB_FULL_MATRIX=1 too.
COMPILED_ROWS = {"plain", "guided + stop + logprobs", "repetition_penalty", "int8", "kv_fp8", "mxfp4"}


def in_suite(row: str, col) -> bool:
    if col.slow:
        return row in COMPILED_ROWS
    return row not in MODEL_ROWS or "+" not in col.name


def cells():
    full = os.environ.get("MOE_LAB_FULL_MATRIX") == "1"
    return [pytest.param(r, c.name, id=f"{r}-{c.name}".replace(" ", "_"), marks=[pytest.mark.slow] if c.slow else [])
            for r in ROWS for c in COLS if full or in_suite(r, c)]


@pytest.mark.parametrize("row,col", cells())
def test_cell(row, col, rows, columns, bpe_tok):
    setting, prepared, reference = rows(row)
    outcome, detail = fm.run_cell(prepared, bpe_tok, setting, columns[col], reference)
    assert outcome != "FAILS", detail
    assert outcome == documented()[(row.lower(), col)], detail


def test_a_refusal_names_both_options(rows, columns, bpe_tok):
    setting, prepared, reference = rows("kv_fp8")
    outcome, detail = fm.run_cell(prepared, bpe_tok, setting, columns["compile"], reference)
    assert outcome == "refused" and re.search(r"kv_cache_dtype.*compile", detail), detail


def test_a_refusal_not_naming_both_options_fails_the_cell(rows, columns, bpe_tok):
    """The harness's own rule: a refusal is only an outcome when its message names an option of the
    row and one of the column (here the real kv_fp8 x compile refusal, with names it lacks)."""
    setting, prepared, reference = rows("kv_fp8")
    unnamed_row = dataclasses.replace(setting, words=("no_such_option",))
    outcome, detail = fm.run_cell(prepared, bpe_tok, unnamed_row, columns["compile"], reference)
    assert outcome == "FAILS" and "without naming both options" in detail, detail
    unnamed_col = dataclasses.replace(columns["compile"], words=("no_such_option",))
    assert fm.run_cell(prepared, bpe_tok, setting, unnamed_col, reference)[0] == "FAILS"
    either = dataclasses.replace(setting, words=("no_such_option", "kv_cache_dtype"))  # one of several suffices
    assert fm.run_cell(prepared, bpe_tok, either, columns["compile"], reference)[0] == "refused"
