"""The throughput-latency frontier of `python -m benchmarks.serving --sweep` (frontier.py): the
Pareto marking on synthetic numbers (dominated points are not marked, the others are; a level
that lost requests is never optimal), the table and the plot."""

from __future__ import annotations

from benchmarks import serving as bench


def test_pareto_marks_exactly_the_non_dominated_points():
    # (throughput, latency): higher throughput and lower latency are better
    pts = [(100, 50), (200, 80), (150, 90), (200, 60), (50, 40), (300, 500), (300, 500), (90, 60), (None, 10)]
    assert bench.pareto(pts) == [True, False, False, True, True, True, True, False, False]
    # (200, 80) and (150, 90) are dominated by (200, 60); (90, 60) by (100, 50); equal points do
    # not dominate each other; a point without a number is never optimal.
    assert bench.pareto([(1.0, 1.0)]) == [True] and bench.pareto([]) == []
    # an ineligible point (lost requests) neither sits on the frontier nor pushes others off it
    assert bench.pareto([(500, 10), (100, 50)], eligible=[False, True]) == [False, True]


def _level(conc, tput, ttft, itl, ok=1.0):
    return {"concurrency": conc, "request_rate": None, "output_throughput": tput, "success_rate": ok,
            "ttft_ms": {"p99": ttft}, "itl_ms": {"p99": itl}}


def test_frontier_points_and_table_on_synthetic_runs(tmp_path):
    runs = [{"setting": {"max_num_seqs": "32"}, "levels": [_level(1, 100, 50, 10), _level(8, 300, 400, 30)]},
            {"setting": {"max_num_seqs": "64"}, "levels": [_level(1, 90, 60, 9), _level(8, 350, 900, 40, ok=0.9)]}]
    pts = bench.frontier_points(runs)
    assert [(p["label"], p["level"]) for p in pts] == [("max_num_seqs=32", "1"), ("max_num_seqs=32", "8"),
                                                       ("max_num_seqs=64", "1"), ("max_num_seqs=64", "8")]
    assert [p["pareto_ttft"] for p in pts] == [True, True, False, False]  # (90, 60) dominated; (350, ..) lost requests
    assert [p["pareto_itl"] for p in pts] == [True, True, True, False]  # (90, 9): the lowest ITL
    table = bench.frontier_table(pts)
    assert table.count("\n") == 6 and "| max_num_seqs=64 | 8 | 90% | 350.0 | 900.0 | 40.0 |  |  |" in table
    bench.plot_frontier(pts, tmp_path / "f.png", "synthetic")
    assert (tmp_path / "f.png").stat().st_size > 5000
