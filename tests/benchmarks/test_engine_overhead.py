"""benchmarks/engine_overhead.py runs end to end at a tiny size (it had stopped building its stub
engine when router configs became per-variant, and only its import was tested): every scenario is
timed, its block tables and greedy tokens are checked (no mismatches), and the JSON is written."""
import json

from benchmarks import engine_overhead


def test_a_tiny_run_checks_and_writes_every_scenario(tmp_path):
    out = tmp_path / "eo.json"
    rc = engine_overhead.main(["--contexts", "32", "64", "--num-seqs", "3", "--steps", "1", "--no-mix",
                               "--out", str(out)])
    assert rc in (0, None)
    rows = json.loads(out.read_text())
    rows = rows["results"] if isinstance(rows, dict) else rows
    assert [r["max_context"] for r in rows] == [32, 64]
    assert all(r["mismatches"] == [] and r["step_ms_median"] > 0 for r in rows)
