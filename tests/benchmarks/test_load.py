"""benchmarks/load.py's record: `--out` writes the per-loader results (the JSON that
docs/results/loading/ records), and only when asked. The loaders themselves run in fresh
interpreters (three start-ups of torch and transformers, ~20 s on 2 cores: an end-to-end test of
them was dropped to keep the suite near 10 minutes); the recorded runs exercise them, and a
difference in their logits makes the command exit 1."""

from __future__ import annotations

import torch


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
