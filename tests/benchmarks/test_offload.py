"""benchmarks/offload.py: one tiny run per source kind gives a row per configuration with wall and
CPU seconds per repeat, exact outputs, the counts that do not depend on the load (on-demand keeps
nothing; int4 experts move their stored bytes), and a PNG; a bad name is one line."""

from __future__ import annotations

import json

import torch

from benchmarks.offload import main

ARGS = ["--residency", "0.25", "--policies", "ondemand", "lru", "--batch", "2", "--max-tokens", "3",
        "--repeats", "2", "--threads", "1"]


def test_tiny_run_rows_and_plot(tmp_path):
    n = torch.get_num_threads()
    try:
        out, png = tmp_path / "o.json", tmp_path / "o.png"
        assert main(["--models", "tiny", "--quantization", "none", "int4", *ARGS, "--out", str(out),
                     "--plot", str(png)]) == 0
    finally:
        torch.set_num_threads(n)
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * (1 + 2)  # per quantization: resident + 2 policies
    assert all(r["exact"] and len(r["seconds_all"]) == len(r["cpu_s_all"]) == 2 for r in rows)
    assert all(r["tokens_per_s"] > 0 and r["tokens_per_cpu_s"] > 0 for r in rows)
    by = {(r["quantization"], r["policy"], r["residency"]): r for r in rows}
    assert by[("none", "ondemand", 0.25)]["hit_rate"] == 0 and by[("none", "resident", 1.0)]["experts_per_layer"] == 8
    assert by[("none", "lru", 0.25)]["bytes_per_token"] <= by[("none", "ondemand", 0.25)]["bytes_per_token"]
    fp32, int4 = by[("none", "ondemand", 0.25)]["bytes_per_token"], by[("int4", "ondemand", 0.25)]["bytes_per_token"]
    # stored int4 bytes (codes, fp32 scales, zero points; tiny's 64 inputs pad one group of 128): 3.7x fewer
    # than fp32, where dequantised slots would move as many bytes as fp32 ones
    assert 0 < int4 < fp32 / 3
    assert png.stat().st_size > 0
    png.unlink()
    assert main(["--replot", str(out), "--plot", str(png)]) == 0 and png.stat().st_size > 0


def test_unknown_model_is_one_line(tmp_path, capsys):
    out = tmp_path / "o.json"
    assert main(["--models", "mixtral_huge", "--out", str(out)]) == 2
    assert "--models 'mixtral_huge' is unknown" in capsys.readouterr().err and not out.exists()
