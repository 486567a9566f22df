"""The serving benchmark's figure is readable: every axis labelled, log axes with plain-number
tick labels, also when the latencies span less than a decade."""

from __future__ import annotations

import pytest

from benchmarks.serving import report as bench


def level(concurrency, ttft, itl, tok_s):
    return {"concurrency": concurrency, "request_rate": None, "output_throughput": tok_s,
            "request_throughput": tok_s / 64, "ttft_ms": {"median": ttft, "p99": 1.6 * ttft, "mean": 1.1 * ttft},
            "itl_ms": {"median": itl, "p99": 1.3 * itl, "mean": 1.05 * itl}}


@pytest.mark.parametrize("levels", [
    [level(1, 31.0, 22.0, 40.0), level(8, 45.0, 27.0, 250.0), level(32, 58.0, 35.0, 600.0)],  # within a decade
    [level(1, 12.0, 9.0, 40.0), level(50, 900.0, 60.0, 900.0), level(200, 7400.0, 210.0, 1500.0)],  # decades
])
def test_every_axis_is_labelled_and_log_ticks_are_numbers(levels):
    import matplotlib.pyplot as plt
    fig = bench.make_figure(levels, "tiny | chat | max_tokens 64")
    try:
        fig.canvas.draw()
        axes = fig.get_axes()
        assert len(axes) == 4  # TTFT, ITL, throughput and its req/s twin
        assert all(a.get_ylabel() for a in axes)
        assert all(a.get_xlabel() == "concurrency" for a in axes[:3])
        for ax in axes[:2]:
            assert ax.get_yscale() == "log"
            lo, hi = ax.get_ylim()
            shown = [t for t in ax.yaxis.get_major_ticks() if lo <= t.get_loc() <= hi]
            texts = [t.label1.get_text() for t in shown]
            assert len(texts) >= 2 and all(texts), texts
            assert all(float(t.replace(",", "")) > 0 for t in texts), texts  # plain numbers, no 10^n mathtext
    finally:
        plt.close(fig)
