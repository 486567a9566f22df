"""benchmarks/train_throughput.py at a toy size: both sides' steps are timed by wall clock and by
process CPU time, every step is kept, and the two ratios are HF's median over ours."""

from __future__ import annotations

import argparse
import statistics

import pytest

from benchmarks.train_throughput import bench, to_markdown


@pytest.mark.slow
def test_bench_keeps_every_step_and_both_ratios():
    pytest.importorskip("transformers")
    args = argparse.Namespace(model="tiny", vocab=256, batch=2, seq=16, steps=3, warmup=1, dtype="fp32",
                              hf_experts="grouped_mm", profile=False)
    res = bench(args)
    (row,) = res["runs"]
    for side in ("ours", "hf"):
        r = row[side]
        assert len(r["step_s"]) == len(r["cpu_step_s"]) == 3  # warm-up steps are not kept
        assert r["median_step_s"] == statistics.median(r["step_s"]) > 0
        assert r["cpu_median_step_s"] == statistics.median(r["cpu_step_s"]) > 0
    assert row["speedup_ours_over_hf"] == pytest.approx(row["hf"]["median_step_s"] / row["ours"]["median_step_s"])
    assert row["cpu_speedup_ours_over_hf"] == pytest.approx(
        row["hf"]["cpu_median_step_s"] / row["ours"]["cpu_median_step_s"])
    assert f"{row['cpu_speedup_ours_over_hf']:.2f}x" in to_markdown(res)
