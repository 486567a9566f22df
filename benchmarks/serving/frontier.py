"""The throughput-latency frontier of a `--sweep`: every (server setting, load level) is a point
(output tokens/s, P99 TTFT) and (output tokens/s, P99 ITL); a point is Pareto-optimal when no
other point has at least its throughput and at most its latency, one of them strictly. A level
that lost requests is no operating point: it is listed but never on the frontier. Output: a
Markdown table (one row per point, a mark where it is on each frontier) and a PNG (both
frontiers, the optimal points marked and joined)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from benchmarks.serving.report import fmt, level_label
from moe.report import markdown_table

LATENCIES = (("ttft", "ttft_ms", "P99 TTFT (ms)"), ("itl", "itl_ms", "P99 ITL (ms)"))


def pareto(points: Sequence[tuple[Optional[float], Optional[float]]],
           eligible: Optional[Sequence[bool]] = None) -> list[bool]:
    """For (throughput, latency) points, whether each is non-dominated among the eligible ones
    (higher throughput and lower latency are better; points with a None are never optimal)."""
    ok = [t is not None and lat is not None and (eligible is None or eligible[i])
          for i, (t, lat) in enumerate(points)]
    out = []
    for i, (t, lat) in enumerate(points):
        dominated = any(ok[j] and j != i and points[j][0] >= t and points[j][1] <= lat
                        and (points[j][0] > t or points[j][1] < lat) for j in range(len(points))) if ok[i] else True
        out.append(ok[i] and not dominated)
    return out


def setting_label(setting: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items()) or "(defaults)"


def frontier_points(runs: list[dict]) -> list[dict]:
    """One point per (setting, level) of `runs` ([{"setting": {...}, "levels": [summary, ...]}]),
    with `pareto_ttft` / `pareto_itl` set."""
    points = []
    for run in runs:
        for lv in run["levels"]:
            points.append({"setting": run["setting"], "label": setting_label(run["setting"]),
                           "level": level_label(lv), "output_throughput": lv["output_throughput"],
                           "success_rate": lv["success_rate"], "p99_ttft_ms": lv["ttft_ms"]["p99"],
                           "p99_itl_ms": lv["itl_ms"]["p99"]})
    eligible = [p["success_rate"] == 1.0 for p in points]
    for name, _, _ in LATENCIES:
        marks = pareto([(p["output_throughput"], p[f"p99_{name}_ms"]) for p in points], eligible)
        for p, m in zip(points, marks):
            p[f"pareto_{name}"] = m
    return points


def frontier_table(points: list[dict]) -> str:
    columns = ["Setting", "Level", "OK", "Out tok/s", "P99 TTFT ms", "P99 ITL ms", "Pareto (TTFT)", "Pareto (ITL)"]
    rows = [[p["label"], p["level"], f"{p['success_rate']:.0%}", f"{p['output_throughput']:.1f}",
             fmt(p["p99_ttft_ms"]), fmt(p["p99_itl_ms"]), "yes" if p["pareto_ttft"] else "",
             "yes" if p["pareto_itl"] else ""] for p in points]
    return markdown_table(columns, rows) + "\n"


def plot_frontier(points: list[dict], path: Path, title: str) -> None:
    import matplotlib  # lazy: heavy, and only the final report needs it
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(p["label"] for p in points))  # in sweep order
    colors = {lab: plt.cm.tab10(i % 10) for i, lab in enumerate(labels)}
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, (name, _, axis_name) in zip(axes, LATENCIES):
        for lab in labels:
            mine = [p for p in points if p["label"] == lab and p[f"p99_{name}_ms"] is not None]
            ax.plot([p[f"p99_{name}_ms"] for p in mine], [p["output_throughput"] for p in mine], "o:",
                    color=colors[lab], alpha=0.6, label=lab)
            for p in mine:
                ax.annotate(p["level"], (p[f"p99_{name}_ms"], p["output_throughput"]), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")
        best = sorted((p for p in points if p[f"pareto_{name}"]), key=lambda p: p[f"p99_{name}_ms"])
        ax.plot([p[f"p99_{name}_ms"] for p in best], [p["output_throughput"] for p in best], "*-", color="black",
                markersize=14, markerfacecolor="gold", label="Pareto frontier")
        ax.set_xscale("log")
        ax.set_xlabel(axis_name)
        ax.set_ylabel("output tokens/s")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
