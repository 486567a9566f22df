"""Summarize repeated `python -m benchmarks.serving` runs (this record's tables).

    python docs/results/serving/summarize.py single RUN_DIR... [--json OUT]
    python docs/results/serving/summarize.py frontier RUN_DIR... [--json OUT] [--png OUT]

`single`: each RUN_DIR holds one run's `tiny-cpu.json`; per concurrency level, the median (min-max)
over the runs of the throughputs, the latency statistics the benchmark reports and what the server
did (steps, model-busy share, preemptions, prefix-cache hit rate).

`frontier`: each RUN_DIR holds one sweep's `tiny-cpu-frontier.json`; per (setting, level), the
median (min-max) over the runs of output tokens/s, P99 TTFT and P99 ITL, whether the point is
Pareto-optimal among the medians (benchmarks.serving.frontier.pareto), and in how many runs it was
on each frontier. `--png` plots the median points with benchmarks.serving.frontier.plot_frontier.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.serving.frontier import LATENCIES, pareto, plot_frontier
from benchmarks.serving.report import level_label


def mmm(values: list) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def show(s: dict, nd: int = 1, scale: float = 1.0) -> str:
    if s["median"] is None:
        return "-"
    return f"{s['median'] * scale:.{nd}f} ({s['min'] * scale:.{nd}f}-{s['max'] * scale:.{nd}f})"


def single(run_dirs: list[Path]) -> tuple[dict, str]:
    reports = [json.loads((d / "tiny-cpu.json").read_text()) for d in run_dirs]
    levels = []
    for k, lv0 in enumerate(reports[0]["levels"]):
        lvs = [r["levels"][k] for r in reports]
        assert all(level_label(lv) == level_label(lv0) for lv in lvs), "runs with different levels"
        row = {"level": level_label(lv0), "completed": sum(lv["completed"] for lv in lvs),
               "sent": sum(lv["num_requests"] for lv in lvs)}
        for key in ("request_throughput", "output_throughput", "duration_s"):
            row[key] = mmm([lv[key] for lv in lvs])
        for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_s"):
            row[key] = {q: mmm([lv[key][q] for lv in lvs]) for q in ("mean", "median", "p99")}
        for key in ("engine_steps_total", "model_busy_fraction", "num_preemptions_total", "prefix_cache_hit_rate"):
            row[key] = mmm([lv.get("server", {}).get(key) for lv in lvs])
        levels.append(row)
    out = ["| Concurrency | OK / sent (3 runs) | Req/s | Out tok/s | TTFT ms median | TTFT ms P99 | ITL ms median "
           "| ITL ms P99 | TPOT ms median | E2E s median |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in levels:
        out.append(f"| {r['level']} | {r['completed']} / {r['sent']} | {show(r['request_throughput'], 2)} | "
                   f"{show(r['output_throughput'])} | {show(r['ttft_ms']['median'])} | {show(r['ttft_ms']['p99'])} | "
                   f"{show(r['itl_ms']['median'])} | {show(r['itl_ms']['p99'])} | {show(r['tpot_ms']['median'])} | "
                   f"{show(r['e2e_s']['median'], 2)} |")
    out += ["", "| Concurrency | Steps | Model busy % | Preemptions | Prefix-cache hit rate (since start) |",
            "|---|---|---|---|---|"]
    for r in levels:
        out.append(f"| {r['level']} | {show(r['engine_steps_total'], 0)} | {show(r['model_busy_fraction'], 0, 100)} | "
                   f"{show(r['num_preemptions_total'], 0)} | {show(r['prefix_cache_hit_rate'], 2)} |")
    info = {"model": reports[0]["model"], "prompts": reports[0]["prompts"],
            "machine": [r["machine"] for r in reports], "started": [r.get("started") for r in reports]}
    return {"runs": [str(d) for d in run_dirs], **info, "levels": levels}, "\n".join(out)


def frontier(run_dirs: list[Path]) -> tuple[dict, str, list]:
    reports = [json.loads((d / "tiny-cpu-frontier.json").read_text()) for d in run_dirs]
    points = []
    for k, p0 in enumerate(reports[0]["frontier"]):
        ps = [r["frontier"][k] for r in reports]
        assert all(p["label"] == p0["label"] and p["level"] == p0["level"] for p in ps), "runs with different points"
        points.append({"setting": p0["setting"], "label": p0["label"], "level": p0["level"],
                       "success_rate": min(p["success_rate"] for p in ps),
                       "output_throughput_runs": mmm([p["output_throughput"] for p in ps]),
                       **{f"p99_{n}_ms_runs": mmm([p[f"p99_{n}_ms"] for p in ps]) for n, _, _ in LATENCIES},
                       **{f"pareto_{n}_in_runs": sum(bool(p[f"pareto_{n}"]) for p in ps) for n, _, _ in LATENCIES}})
    for p in points:  # the median point, in the shape plot_frontier reads
        p["output_throughput"] = p["output_throughput_runs"]["median"]
        for n, _, _ in LATENCIES:
            p[f"p99_{n}_ms"] = p[f"p99_{n}_ms_runs"]["median"]
    eligible = [p["success_rate"] == 1.0 for p in points]
    for n, _, _ in LATENCIES:
        marks = pareto([(p["output_throughput"], p[f"p99_{n}_ms"]) for p in points], eligible)
        for p, m in zip(points, marks):
            p[f"pareto_{n}"] = m
    runs = len(reports)
    out = ["| Setting | Level | OK (all runs) | Out tok/s | P99 TTFT ms | P99 ITL ms | Pareto (TTFT): median / runs "
           "| Pareto (ITL): median / runs |", "|---|---|---|---|---|---|---|---|"]
    for p in points:
        marks = [f"{'yes' if p[f'pareto_{n}'] else 'no'} / {p[f'pareto_{n}_in_runs']} of {runs}" for n, _, _ in LATENCIES]
        out.append(f"| {p['label']} | {p['level']} | {p['success_rate']:.0%} | {show(p['output_throughput_runs'])} | "
                   f"{show(p['p99_ttft_ms_runs'])} | {show(p['p99_itl_ms_runs'])} | {marks[0]} | {marks[1]} |")
    data = {"runs": [str(d) for d in run_dirs], "model": reports[0]["runs"][0]["model"],
            "machine": [r["machine"] for r in reports], "points": points}
    return data, "\n".join(out), points


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["single", "frontier"])
    ap.add_argument("run_dirs", type=Path, nargs="+")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None)
    args = ap.parse_args()
    if args.what == "single":
        data, table = single(args.run_dirs)
    else:
        data, table, points = frontier(args.run_dirs)
        if args.png is not None:
            plot_frontier(points, args.png, f"{data['model']} | chat | max_tokens 32 | P99 latency vs throughput, "
                          f"median of {len(args.run_dirs)} runs")
    if args.json is not None:
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
