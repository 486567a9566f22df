"""The levels as a Markdown table (`moe.report.markdown_table`) and a plot (TTFT, ITL, throughput)."""

from __future__ import annotations

import math
from pathlib import Path

from moe.report import markdown_table


def fmt(v, nd=1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def mean_median_p99(s: dict, nd=1) -> str:
    return f"{fmt(s['mean'], nd)} / {fmt(s['median'], nd)} / {fmt(s['p99'], nd)}"


def level_label(lv: dict) -> str:
    if lv.get("request_rate") is not None:
        cap = f", max {lv['concurrency']}" if lv.get("concurrency") else ""
        return f"{lv['request_rate']:g} req/s{cap}"
    return str(lv["concurrency"])


def level_line(lv: dict) -> str:
    """One line of progress for a finished level."""
    return (f"[{level_label(lv)}] {lv['completed']}/{lv['num_requests']} ok in {lv['duration_s']:.1f} s | "
            f"{lv['output_throughput']:.1f} out tok/s | TTFT p50 {fmt(lv['ttft_ms']['median'])} ms "
            f"p99 {fmt(lv['ttft_ms']['p99'])} ms | ITL p50 {fmt(lv['itl_ms']['median'])} ms "
            f"p99 {fmt(lv['itl_ms']['p99'])} ms")


def levels_table(levels: list[dict]) -> str:
    columns = ["Concurrency", "OK / sent", "Req/s", "Out tok/s", "TTFT ms (mean / med / P99)",
               "ITL ms (mean / med / P99)", "TPOT ms (mean / med / P99)", "E2E s (mean / med / P99)"]
    rows = [[level_label(lv), f"{lv['completed']} / {lv['num_requests']} ({lv['success_rate']:.0%})",
             f"{lv['request_throughput']:.2f}", f"{lv['output_throughput']:.1f}", mean_median_p99(lv["ttft_ms"]),
             mean_median_p99(lv["itl_ms"]), mean_median_p99(lv["tpot_ms"]), mean_median_p99(lv["e2e_s"], 2)]
            for lv in levels]
    return markdown_table(columns, rows) + "\n"


def _readable_log_axis(ax, values: list[float], label: str) -> None:
    """A log y axis with plain-number tick labels (matplotlib's defaults label only powers of ten,
    as 10^1, and leave a range within one decade with no labelled tick at all)."""
    import matplotlib.ticker as mticker  # lazy: with matplotlib, only for the final report

    ax.set_yscale("log")
    ax.set_ylabel(label)
    finite = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    decades = math.log10(max(finite) / min(finite)) if finite else 0.0
    ax.yaxis.set_major_locator(mticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)) if decades >= 1
                               else mticker.MaxNLocator(nbins=5, min_n_ticks=3))
    ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 10 else f"{v:g}"))
    ax.yaxis.set_minor_formatter(mticker.NullFormatter())


def make_figure(levels: list[dict], title: str):
    """Latency (TTFT, ITL: median, P99, mean on log axes) and throughput against the load level."""
    import matplotlib  # lazy: heavy, and only the final report needs it
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [level_label(lv) for lv in levels]
    x = range(len(levels))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, name in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "itl_ms", "ITL")):
        shown = []
        for stat, style in (("median", "o-"), ("p99", "s--"), ("mean", "^:")):
            ys = [lv[key][stat] if lv[key][stat] is not None else float("nan") for lv in levels]
            shown += ys
            ax.plot(x, ys, style, label=stat)
        ax.set_title(f"{name} (ms, log scale)")
        _readable_log_axis(ax, shown, f"{name} (ms)")
    ax = axes[2]
    ax.bar(x, [lv["output_throughput"] for lv in levels], color="tab:green", alpha=0.7, label="output tok/s")
    ax.set_title("Output throughput (tok/s)")
    ax.set_ylabel("output tokens/s")
    ax2 = ax.twinx()
    ax2.plot(x, [lv["request_throughput"] for lv in levels], "ko-", label="req/s")
    ax2.set_ylabel("requests/s")
    for a in axes:
        a.set_xticks(list(x))
        a.set_xticklabels(labels)
        a.set_xlabel("concurrency" if levels and levels[0].get("request_rate") is None else "request rate")
        a.grid(alpha=0.3)
    axes[0].legend()
    axes[1].legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot(levels: list[dict], path: Path, title: str) -> None:
    import matplotlib.pyplot as plt  # lazy: heavy, and only the final report needs it

    fig = make_figure(levels, title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
