"""benchmarks/step_ops_ab.py: every pair runs at tiny counts with its outputs compared first, the
JSON holds each pair's rounds, and a replacement that changes an output exits 1 (and is not timed)."""

import json

from benchmarks import step_ops_ab as ab


def test_every_pair_is_checked_and_timed(tmp_path):
    out = tmp_path / "ops.json"
    assert ab.main(["--batches", "1", "3", "--rounds", "2", "--calls", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    got = {(r["batch"], r["pair"]) for r in rows}
    assert got == {(1, p) for p in ("finite_check", "greedy_argmax", "rotary", "contiguous_views")} | \
        {(3, p) for p in ("finite_check", "greedy_argmax", "rotary", "gathered_plan")}
    for r in rows:
        assert all(len(v) == 2 and min(v) >= 0 for v in r["us_per_call"].values())
        assert r["old"]["min"] <= r["old"]["median"] <= r["old"]["max"]
    assert "plan_once_us" in next(r for r in rows if r["pair"] == "gathered_plan")


def test_a_changed_output_exits_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ab, "row_argmax", lambda x: x.argmin(dim=-1))  # a planted wrong replacement
    out = tmp_path / "ops.json"
    assert ab.main(["--batches", "2", "--rounds", "1", "--calls", "1", "--json", str(out)]) == 1
    assert "greedy_argmax: outputs differ" in capsys.readouterr().err
    assert "greedy_argmax" not in {r["pair"] for r in json.loads(out.read_text())["results"]}
