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
    # 2 sequences of 40+ tokens in blocks of 4: 11+ blocks each kept by full layers; a window of 8 and one decode
    # token span at most 3 blocks a sequence
    held = [r["blocks_in_use"] for r in ctx["window"]["repeats"]]
    assert max(held) <= 2 * 3 and min(r["blocks_in_use"] for r in ctx["full"]["repeats"]) >= 2 * 11
    # the hybrid keeps a table per group: its full layer's 11+ blocks and its window layer's <= 3 a sequence, in
    # blocks of one layer (half a 2-layer block), so about (11 + 3) / 22 of the all-full model's KV bytes
    for alt, full in zip(ctx["alternating"]["repeats"], ctx["full"]["repeats"]):
        assert full["blocks_in_use"] <= alt["blocks_in_use"] <= full["blocks_in_use"] + 2 * 3
        assert alt["kv_bytes_in_use"] * 2 == alt["blocks_in_use"] * full["kv_bytes_in_use"] // full["blocks_in_use"]
        assert 0.5 < alt["kv_bytes_in_use"] / full["kv_bytes_in_use"] < 0.7
