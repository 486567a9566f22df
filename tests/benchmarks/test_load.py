"""benchmarks/load.py end to end at a small size: both loaders run in fresh interpreters, their
fp32 logits agree, and `--out` writes the same per-loader results the command prints (the JSON
that docs/results/loading/ records)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_out_holds_what_the_command_prints(tmp_path):
    out = tmp_path / "sub" / "load.json"  # a folder that does not exist yet: the command makes it
    p = subprocess.run([sys.executable, "-m", "benchmarks.load", "--size-mb", "4", "--shard-mb", "2",
                        "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    printed = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    record = json.loads(out.read_text())
    assert record["results"] == printed and [r["loader"] for r in printed] == ["ours", "hf"]
    assert record["family"] == "qwen3_moe" and record["size_mb"] == 4 and len(record["load_after"]) == 3
    for r in printed:
        assert r["seconds"] > 0 and r["weights_bytes"] > 1e6
        assert r["rss_ratio"] == pytest.approx(r["peak_rss_bytes"] / r["weights_bytes"])
        assert r["logits_max_abs_diff"] <= record["atol"]


def fake_measure(kind, directory, logits_out, seed):
    """A loader that takes no time or memory to run: equal logits, 1.5x the weights' bytes."""
    torch.save(torch.zeros(2), logits_out)
    return {"loader": kind, "seconds": 1.0, "peak_rss_bytes": 1500, "dtype": "bfloat16"}


def test_out_writes_the_record_only_when_asked(tmp_path, monkeypatch):
    import benchmarks.load as load

    calls = []
    monkeypatch.setattr(load, "finish_record", lambda *a: calls.append(a))
    monkeypatch.setattr(load, "make_synthetic_checkpoint", lambda d, *a: d)
    monkeypatch.setattr(load, "weights_bytes", lambda d: 1000)
    monkeypatch.setattr(load, "measure", fake_measure)
    assert load.main([]) == 0 and calls == []  # no --out: no file
    assert load.main(["--out", str(tmp_path / "x.json")]) == 0 and len(calls) == 1
    record, path, wrong = calls[0]
    assert path == str(tmp_path / "x.json") and wrong == []
    assert [(r["loader"], r["rss_ratio"], r["weights_bytes"]) for r in record["results"]] == [
        ("ours", 1.5, 1000), ("hf", 1.5, 1000)]
