"""benchmarks/swa_decode end to end at toy sizes: it times every layout, the window layout holds its
window's blocks only, and a wrong engine output makes it exit 1 without timing anything."""

from __future__ import annotations

import json

from benchmarks import swa_decode

ARGS = ["--contexts", "40", "--window", "8", "--seqs", "2", "--steps", "2", "--repeats", "2", "--block-size", "4",
        "--chunk", "16", "--check-tokens", "3"]


def test_times_every_layout_and_the_window_holds_its_window_only(tmp_path):
    out = tmp_path / "r.json"
    assert swa_decode.main(ARGS + ["--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["check"] == {"window": True, "full": True, "alternating": True}
    ctx = record["contexts"]["40"]
    for layout in ("window", "full", "alternating"):
        rounds = ctx[layout]["repeats"]
        assert len(rounds) == 2 and all(len(r["wall_s"]) == 2 and len(r["cpu_s"]) == 2 for r in rounds)
        s = ctx[layout]["step_wall_s"]
        assert 0 < s["min"] <= s["median"] <= s["max"]
    # 2 sequences of 40+ tokens in blocks of 4: 11+ blocks each kept by full layers (and by the hybrid, which
    # frees nothing at this commit); a window of 8 and one decode token span at most 3 blocks a sequence
    held = [r["blocks_in_use"] for r in ctx["window"]["repeats"]]
    assert max(held) <= 2 * 3 and min(r["blocks_in_use"] for r in ctx["full"]["repeats"]) >= 2 * 11
    assert [r["blocks_in_use"] for r in ctx["alternating"]["repeats"]] == \
        [r["blocks_in_use"] for r in ctx["full"]["repeats"]]


def test_a_wrong_output_exits_1_and_times_nothing(tmp_path, monkeypatch, capsys):
    real = swa_decode.reference_greedy
    monkeypatch.setattr(swa_decode, "reference_greedy", lambda m, p, n: [(t + 1) % swa_decode.VOCAB
                                                                          for t in real(m, p, n)])
    out = tmp_path / "r.json"
    assert swa_decode.main(ARGS + ["--json", str(out)]) == 1
    record = json.loads(out.read_text())
    assert "contexts" not in record and not any(record["check"].values())
    assert capsys.readouterr().err.count("WRONG OUTPUT:") == 3
