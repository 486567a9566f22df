"""Summarise a router sweep: one Markdown table and one PNG of curves per variant.

    python train.py -m router=topk,switch,aux_free seed=0,1 hydra.sweep.dir=/tmp/sweep ...
    python -m benchmarks.sweep_report /tmp/sweep [--out /tmp/sweep/report]

Reads every run directory under the sweep directory (any folder holding the trainer's
`metrics.jsonl` and `config.json`; with Hydra multirun these are `<sweep>/<job num>/`; a sweep run
through a submitit launcher counts only its finished jobs and lists every job's state from its
`sweep.json`, moe/cluster/sweep_state.py),
groups the runs by router variant (plus any other config value that differs between runs,
so a sweep over `router.top_k` too is not averaged as if it were seeds), and writes into
`--out` (default `<sweep dir>/report`, so a report never overwrites another sweep's):

* `<out>/sweep_report.md`: final validation loss mean ± std over the seeds, training
  throughput, and routing health (load imbalance, token and load entropy, dropped
  fraction, dead experts, train/inference overlap, routing stability);
* `<out>/sweep_curves.png`: validation loss and load imbalance against the step, mean
  over seeds with a min-max band, one line per variant;
* `<out>/sweep_report.json`: the numbers behind both (each run's summary, each variant's
  mean, sample std and count), so a committed report keeps its data beside it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from moe import cli, outputs
from moe.cluster.sweep_state import read_sweep
from moe.config import VARIANT_GROUPS
from moe.jsonl import flatten
from moe.report import markdown_table

log = logging.getLogger("sweep_report")

# Config keys that say nothing about the experiment (never used to tell groups apart). "run." is the
# run record train.py adds to config.json (the job's own overrides, its parent run): every job of a
# sweep has different overrides, which is what the varying values already say.
IGNORED_KEYS = ("seed", "logger.", "train.resume", "train.stop_after", "data.cache_dir", "data.num_proc",
                "train.device", "train.peak_flops", "cluster.", "run.")

# Routing metrics averaged over the last `tail` fraction of the log steps of a run.
TAIL_METRICS = {
    "load_imbalance": "moe/load_imbalance",
    "token_entropy": "moe/token_entropy_norm",
    "load_entropy": "moe/load_entropy_norm",
    "dropped_frac": "moe/dropped_frac",
    "dead_experts": "moe/dead_experts",
    "train_eval_overlap": "moe/train_eval_overlap",
}

COLUMNS = [  # (summary key, header, format)
    ("final_val_loss", "final val loss", "{:.4f}"),
    ("tokens_per_s", "tokens/s", "{:,.0f}"),
    ("load_imbalance", "load imbalance (max/mean)", "{:.2f}"),
    ("token_entropy", "token entropy (norm.)", "{:.3f}"),
    ("load_entropy", "load entropy (norm.)", "{:.3f}"),
    ("dropped_frac", "dropped frac.", "{:.3f}"),
    ("dead_experts", "dead experts", "{:.2f}"),
    ("train_eval_overlap", "train/inference overlap", "{:.3f}"),
    ("routing_stability", "routing stability", "{:.3f}"),
]


@dataclass
class Run:
    path: Path
    config: dict
    records: list[dict]
    summary: dict = field(default_factory=dict)

    @property
    def router(self) -> str:
        return str(self.config.get("router", {}).get("name", "?"))

    @property
    def seed(self):
        return self.config.get("seed")

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(int(r["step"]), float(r[key])) for r in self.records
                if key in r and r[key] is not None and "step" in r]


def find_run_dirs(sweep_dir: Path) -> list[Path]:
    """Folders under `sweep_dir` (itself included) with both metrics.jsonl and config.json,
    in natural order (Hydra job numbers sort as numbers)."""
    def key(p: Path):
        # (0, n) before (1, name): job numbers sort as numbers, and a folder named otherwise still compares
        return [(0, int(part)) if part.isdigit() else (1, part) for part in p.relative_to(sweep_dir).parts]

    dirs = {p.parent for p in Path(sweep_dir).rglob("metrics.jsonl") if (p.parent / "config.json").is_file()}
    return sorted(dirs, key=key)


def read_metrics(path: Path) -> list[dict]:
    records = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s:%d: not JSON, skipped (a run killed mid-write?)", path, i + 1)
    return records


def cli_layout(config: dict) -> dict:
    """A resolved config with the variant sections (`model.router`, `model.attention`,
    `model.experts`) moved back to the top, as the command line names them (`router.top_k=2`):
    the labels of the report read like the sweep's overrides. Configs of the old layout pass."""
    model = dict(config.get("model", {}))
    out = {k: v for k, v in config.items() if k != "model"}
    for group in VARIANT_GROUPS:
        if group in model:
            out[group] = model.pop(group)
    out["model"] = model
    return out


def load_run(run_dir: Path) -> Run:
    config = cli_layout(json.loads((run_dir / "config.json").read_text()))
    return Run(run_dir, config, read_metrics(run_dir / "metrics.jsonl"))


def _mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else float("nan")


def summarize_run(run: Run, tail: float = 0.25) -> dict:
    """Scalars of one run: final validation loss, median throughput, and the routing
    metrics averaged over the last `tail` fraction of its log steps."""
    s: dict = {}
    val = run.series("val/loss")
    s["final_val_loss"] = val[-1][1] if val else float("nan")
    s["final_step"] = max((int(r.get("step", 0)) for r in run.records), default=0)
    tps = [v for _, v in run.series("perf/tokens_per_s")]
    s["tokens_per_s"] = statistics.median(tps) if tps else float("nan")
    for name, key in TAIL_METRICS.items():
        values = [v for _, v in run.series(key)]
        n = max(1, math.ceil(tail * len(values))) if values else 0
        s[name] = _mean(values[-n:]) if values else float("nan")
    stab = run.series("moe/routing_stability")
    s["routing_stability"] = stab[-1][1] if stab else float("nan")
    return s


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs by variant label: the router name, plus `key=value` for every other config
    value that differs between runs of the same router (seeds and bookkeeping keys
    excluded), so e.g. a sweep over `router.top_k` too is not averaged as if it were seeds."""
    flat = [flatten(r.config) for r in runs]
    keys = sorted({k for f in flat for k in f})
    by_router: dict[str, list[dict]] = {}
    for run, f in zip(runs, flat):
        by_router.setdefault(run.router, []).append(f)
    # Only values that differ between runs of the SAME router tell variants apart: each
    # router's own yaml defaults (top_k=1 for switch, ...) are part of its name.
    varying = {name: [k for k in keys if k != "router.name" and not k.startswith(IGNORED_KEYS)
                      and len({json.dumps(f.get(k), sort_keys=True) for f in fs}) > 1]
               for name, fs in by_router.items()}
    groups: dict[str, list[Run]] = {}
    for run, f in zip(runs, flat):
        extra = [f"{k}={f.get(k)}" for k in varying[run.router]]
        label = run.router + (f" ({', '.join(extra)})" if extra else "")
        groups.setdefault(label, []).append(run)
    return groups


def mean_std(values: list[float]) -> tuple[float, float, int]:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return float("nan"), float("nan"), 0
    std = statistics.stdev(values) if len(values) > 1 else float("nan")
    return statistics.fmean(values), std, len(values)


def aggregate(groups: dict[str, list[Run]]) -> dict[str, dict]:
    """Per variant: mean and std over its runs (seeds) of every summary scalar."""
    out = {}
    for label, runs in groups.items():
        agg = {"runs": len(runs), "seeds": sorted({r.seed for r in runs}, key=str)}
        for key, _, _ in COLUMNS + [("final_step", "", "")]:
            m, sd, n = mean_std([r.summary.get(key, float("nan")) for r in runs])
            agg[key] = (m, sd, n)
        out[label] = agg
    return out


def _fmt(fmt: str, value: float) -> str:
    return "–" if value is None or not math.isfinite(value) else fmt.format(value)


def sweep_table(agg: dict[str, dict]) -> str:
    """The table: val loss as mean ± std over seeds (the best mean in bold), the others as means."""
    header = ["variant", "runs"] + [h for _, h, _ in COLUMNS]
    rows = []
    finite = [a["final_val_loss"][0] for a in agg.values() if math.isfinite(a["final_val_loss"][0])]
    best = min(finite) if finite else None
    for label, a in agg.items():
        cells = [f"`{label}`", str(a["runs"])]
        for key, _, fmt in COLUMNS:
            m, sd, n = a[key]
            if key == "final_val_loss":
                cell = _fmt(fmt, m) + (f" ± {_fmt(fmt, sd)}" if n > 1 else "")
                if best is not None and m == best:
                    cell = f"**{cell}**"
            else:
                cell = _fmt(fmt, m)
            cells.append(cell)
        rows.append(cells)
    return markdown_table(header, rows, align=["l"] + ["r"] * (len(header) - 1))


def _curve(runs: list[Run], key: str):
    """Mean, min and max over runs at every step some run logged `key`."""
    by_step: dict[int, list[float]] = {}
    for r in runs:
        for step, v in r.series(key):
            if math.isfinite(v):
                by_step.setdefault(step, []).append(v)
    steps = sorted(by_step)
    return (steps, [statistics.fmean(by_step[s]) for s in steps], [min(by_step[s]) for s in steps],
            [max(by_step[s]) for s in steps])


def plot_curves(groups: dict[str, list[Run]], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    panels = [("val/loss", "validation loss"), ("moe/load_imbalance", "load imbalance (max load / mean load)")]
    for ax, (key, title) in zip(axes, panels):
        for label, runs in groups.items():
            steps, mean, lo, hi = _curve(runs, key)
            if not steps:
                continue
            line, = ax.plot(steps, mean, marker="o" if len(steps) < 12 else None, ms=3, label=label)
            if len(runs) > 1:
                ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[1].axhline(1.0, color="gray", lw=0.8, ls="--")  # perfect balance
    axes[0].legend(fontsize=8)
    fig.suptitle("router sweep: mean over seeds (band: min-max)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def jobs_table(state: dict) -> str:
    """Every job of a launcher sweep: its state, what it varies, its final validation loss, attempts."""
    counts = ", ".join(f"{n} {s}" for s, n in state["counts"].items() if n)
    rows = []
    for j in state["jobs"]:
        final = (j.get("final") or {}).get("final_val_loss")
        varying = " ".join(f"{k}={v}" for k, v in (j.get("varying") or {}).items()) or "–"
        rows.append([str(j.get("num")), j.get("state", "?"), f"`{varying}`", _fmt("{:.4f}", final),
                     str(j.get("attempts", 0)), j["error"].splitlines()[0][:120].replace("|", "/") if j.get("error") else ""])
    table = markdown_table(["job", "state", "varies", "final val loss", "attempts", "error"], rows,
                           align=["r", "l", "l", "r", "r", "l"])
    return f"{counts} (from sweep.json)\n\n{table}"


NOTES = """\
Columns: *final val loss* is the last validation loss of each run, mean ± sample std over
the seeds; *tokens/s* the median training throughput over the log steps (training steps
only; on a shared CPU it is noisy). The routing columns average each run's logged value
over the last {tail:.0%} of its log steps, then over seeds: *load imbalance* = max expert
load / mean load (1 = perfectly balanced), *token entropy* = mean per-token router entropy
/ log E (1 = uniform, undecided router), *load entropy* = entropy of the expert-load
distribution / log E (1 = balanced), *dropped frac.* = assignments dropped by capacity /
assignments chosen (for expert_choice: tokens no expert chose / E*C), *dead experts* =
experts that received no token in a log window (per layer), *train/inference overlap* =
fraction of tokens whose expert set in training mode equals the eval-mode set on the same
input, *routing stability* = fraction of the first validation batch's tokens whose eval-mode
expert set is unchanged between the last two validations.
"""


def report_files(out_dir: Path) -> list[Path]:
    """The files a report writes into `out_dir`."""
    return [Path(out_dir) / name for name in ("sweep_report.md", "sweep_curves.png", "sweep_report.json")]


def _finite(value):
    """JSON has no NaN: a metric a run never logged is null."""
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def report_json(sweep_dir: Path, groups: dict[str, list[Run]], agg: dict[str, dict], tail: float,
                command: Optional[str]) -> dict:
    """The report's numbers: every run's summary (by its folder under the sweep) and every variant's
    mean / sample std / count over its runs, as the table shows them."""
    runs = [{"run": str(r.path.relative_to(sweep_dir)), "variant": label, "router": r.router, "seed": r.seed,
             **{k: _finite(v) for k, v in r.summary.items()}}
            for label, rs in groups.items() for r in rs]
    variants = {label: {"runs": a["runs"], "seeds": a["seeds"],
                        **{k: {"mean": _finite(v[0]), "std": _finite(v[1]), "n": v[2]}
                           for k, v in a.items() if isinstance(v, tuple)}}
                for label, a in agg.items()}
    return {"sweep_dir": str(sweep_dir), "command": command, "tail": tail, "runs": runs, "variants": variants}


def write_report(sweep_dir: Path, out_dir: Path, tail: float = 0.25, command: Optional[str] = None,
                 overwrite: bool = False) -> tuple[Path, Path, str]:
    """Read the sweep, write the Markdown report and the PNG; returns (md, png, table). An existing
    report in `out_dir` is refused unless `overwrite`, which moves its files aside."""
    sweep_dir, out_dir = Path(sweep_dir), Path(out_dir)
    for path in report_files(out_dir):  # before reading the sweep: an existing report is not this run's
        outputs.check_free(path, "--overwrite", overwrite)
    run_dirs = find_run_dirs(sweep_dir)
    state = read_sweep(sweep_dir)  # None unless a submitit launcher ran the sweep
    if state is not None:  # a job still running, requeued or failed has no final numbers to compare
        done = {Path(j["run_dir"]).resolve() for j in state["jobs"] if j.get("state") == "done" and j.get("run_dir")}
        run_dirs = [d for d in run_dirs if d.resolve() in done]
    if not run_dirs:
        raise FileNotFoundError(f"no run directories (metrics.jsonl + config.json) under {sweep_dir}"
                                + (" of a finished job" if state is not None else ""))
    runs = []
    for d in run_dirs:
        try:
            run = load_run(d)
        except (OSError, json.JSONDecodeError) as e:
            log.warning("skipping %s: %s", d, e)
            continue
        run.summary = summarize_run(run, tail)
        runs.append(run)
    groups = group_runs(runs)
    agg = aggregate(groups)
    table = sweep_table(agg)
    for path in report_files(out_dir):  # the new report is ready to write: keep the old one beside it
        outputs.move_aside(path)
    png = plot_curves(groups, out_dir / "sweep_curves.png")
    steps = sorted({int(a["final_step"][0]) for a in agg.values() if math.isfinite(a["final_step"][0])})
    lines = [f"# Router sweep: {sweep_dir}", "",
             f"{len(runs)} runs in {len(groups)} variants; seeds per variant: "
             + ", ".join(f"{k}: {a['seeds']}" for k, a in agg.items()) + f"; final steps: {steps}.", ""]
    if command:
        lines += ["Command:", "", "```", command, "```", ""]
    lines += [table, "", NOTES.format(tail=tail), f"![validation loss and load imbalance]({png.name})", ""]
    if state is not None:
        lines += ["## Jobs", "", jobs_table(state), ""]
    md = out_dir / "sweep_report.md"
    md.write_text("\n".join(lines))
    data = report_json(sweep_dir, groups, agg, tail, command)
    (out_dir / "sweep_report.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return md, png, table


@cli.guarded
def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweep_dir", type=Path, help="a Hydra multirun directory (or any folder of run dirs)")
    p.add_argument("--out", type=Path, default=None,
                   help="where to write the report (default: <sweep_dir>/report)")
    p.add_argument("--tail", type=float, default=0.25, help="fraction of the last log steps to average")
    p.add_argument("--command", default=None, help="the sweep command, quoted in the report")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing report (its files are moved aside to <name>.old-<time>, never deleted)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not 0 < args.tail <= 1:
        p.error("--tail must be in (0, 1]")
    try:
        md, png, table = write_report(args.sweep_dir, args.out or args.sweep_dir / "report", args.tail, args.command,
                                      args.overwrite)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table)
    print(f"\nwrote {md}, {png} and {md.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
