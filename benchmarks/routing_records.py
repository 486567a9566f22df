"""Committed records of training runs for the routing docs (issue 29, item 7).

    python -m benchmarks.routing_records collect RUN_DIR DEST           # copy a run's small files
    python -m benchmarks.routing_records aux-free RUN_DIR... [--json F]  # docs/results/sweep/aux_free.md's table
    python -m benchmarks.routing_records monitor RUN_DIR... [--json F]   # docs/design/routing_monitor.md's table

`collect` copies what a record keeps of a run (`metrics.jsonl`, `config.json`, `summary.json`; not
its checkpoints) and, for a router with a selection bias (aux_free), the bias of every layer at the
last checkpoint as `router_bias.json`. The two tables read only those files, so they can be
recomputed from the committed copies.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
from pathlib import Path
from typing import Optional

from benchmarks.sweep_report import cli_layout, read_metrics
from moe import cli
from moe.config import MonitorConfig

RUN_FILES = ("metrics.jsonl", "config.json", "summary.json")
BIAS_KEY = "e_score_correction_bias"  # aux_free's selection bias buffer (moe/routing/routers/aux_free.py)
AUX_FREE_STEPS = (60, 100, 150)  # the steps aux_free.md quotes the imbalance at


def collect(run_dir: Path, dest: Path) -> list[Path]:
    """Copy a run's record files into `dest` (created; an existing file there is refused)."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name in RUN_FILES:
        if (dest / name).exists():
            raise FileExistsError(f"{dest / name} exists; collect writes only into a fresh folder")
        written.append(Path(shutil.copy2(run_dir / name, dest / name)))
    bias = last_checkpoint_bias(run_dir)
    if bias:
        (dest / "router_bias.json").write_text(json.dumps(bias, indent=1) + "\n")
        written.append(dest / "router_bias.json")
    return written


def last_checkpoint_bias(run_dir: Path) -> dict:
    """{"step": N, "layers": {module name: [bias per expert]}} from the run's last checkpoint; {} without one."""
    import torch  # lazy: only `collect` reads checkpoints

    ckpts = sorted((run_dir / "checkpoints").glob("step_*.pt"))
    if not ckpts:
        return {}
    state = torch.load(ckpts[-1], map_location="cpu", weights_only=False)
    layers = {k: [round(float(x), 6) for x in v] for k, v in state["model"].items() if k.endswith(BIAS_KEY)}
    return {"step": int(state.get("step", 0)), "layers": layers} if layers else {}


def load(run_dir: Path) -> dict:
    config = cli_layout(json.loads((run_dir / "config.json").read_text()))
    bias_file = run_dir / "router_bias.json"
    return {"name": run_dir.name, "config": config, "records": read_metrics(run_dir / "metrics.jsonl"),
            "summary": json.loads((run_dir / "summary.json").read_text()),
            "bias": json.loads(bias_file.read_text()) if bias_file.is_file() else {}}


def _layer_values(record: dict, metric: str) -> list[float]:
    return [v for k, v in record.items() if k.startswith("moe/layer") and k.endswith("/" + metric)]


def final_val_loss(run: dict) -> float:
    return [r["val/loss"] for r in run["records"] if "val/loss" in r][-1]


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else float("nan"))


def aux_free_row(runs: list[dict], tail: float = 0.25) -> dict:
    """One rate's row: val loss over the seeds, the layer-average imbalance at AUX_FREE_STEPS and over
    the last `tail` of the log steps (each averaged over the seeds), and the largest within-layer bias
    spread (max - min) at the last checkpoint over the seeds."""
    row = {"runs": [r["name"] for r in runs]}
    row["val_loss_mean"], row["val_loss_std"] = mean_std([final_val_loss(r) for r in runs])
    series = [{int(x["step"]): x["moe/load_imbalance"] for x in r["records"] if "moe/load_imbalance" in x} for r in runs]
    for step in AUX_FREE_STEPS:
        row[f"imbalance_at_{step}"] = statistics.fmean(s[step] for s in series)
    tails = []
    for s in series:
        values = [s[k] for k in sorted(s)]
        tails.append(statistics.fmean(values[-max(1, math.ceil(tail * len(values))):]))
    row["imbalance_tail"] = statistics.fmean(tails)
    spreads = [max(b) - min(b) for r in runs for b in r["bias"].get("layers", {}).values()]
    row["bias_spread"] = max(spreads) if spreads else None
    return row


def monitor_row(run: dict, start_step: Optional[int] = None) -> dict:
    """The routing monitor's view of one run from `start_step` on: per log step the worst layer, then
    the worst step (imbalance, dead experts, load entropy), the range of the highest layer token
    entropy, and the alerts the trainer raised (summary.json)."""
    start = MonitorConfig().start_step if start_step is None else start_step
    steps = [r for r in run["records"] if int(r.get("step", 0)) >= start and _layer_values(r, "load_imbalance")]
    top_token = [max(_layer_values(r, "token_entropy_norm")) for r in steps]
    alerts = run["summary"].get("routing_alerts") or []
    names = sorted({a.split(": ", 1)[1].split(" (")[0] for a in alerts})
    return {"run": run["name"], "steps": max(int(r["step"]) for r in run["records"]),
            "final_val_loss": final_val_loss(run),
            "imbalance": max(max(_layer_values(r, "load_imbalance")) for r in steps),
            "dead": int(max(max(_layer_values(r, "dead_experts")) for r in steps)),
            "load_entropy": min(min(_layer_values(r, "load_entropy_norm")) for r in steps),
            "token_entropy": [min(top_token), max(top_token)],
            "alerts": f"{', '.join(names)} ({len(alerts)})" if alerts else "none"}


def aux_free_table(rows: dict) -> str:
    out = ["| rate | runs | final val loss | imbalance @60 | @100 | @150 | tail | bias spread |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for rate, r in rows.items():
        spread = "-" if r["bias_spread"] is None else f"{r['bias_spread']:.2f}"
        out.append(f"| {rate} | {len(r['runs'])} | {r['val_loss_mean']:.4f} ± {r['val_loss_std']:.4f} | "
                   + " | ".join(f"{r[f'imbalance_at_{s}']:.2f}" for s in AUX_FREE_STEPS)
                   + f" | {r['imbalance_tail']:.2f} | {spread} |")
    return "\n".join(out)


def monitor_table(rows: list[dict]) -> str:
    out = ["| run | steps | final val loss | imbalance | dead | load ent. | token ent. | alerts |",
           "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        lo, hi = r["token_entropy"]
        out.append(f"| {r['run']} | {r['steps']} | {r['final_val_loss']:.3f} | {r['imbalance']:.2f} | {r['dead']} | "
                   f"{r['load_entropy']:.3f} | {lo:.3f}-{hi:.3f} | {r['alerts']} |")
    return "\n".join(out)


def rate_label(run: dict) -> str:
    router = run["config"].get("router", {})
    return str(router.get("bias_update_rate")) if router.get("name") == "aux_free" else str(router.get("name"))


@cli.guarded
def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["collect", "aux-free", "monitor"])
    p.add_argument("paths", type=Path, nargs="+", help="run directories (collect: RUN_DIR DEST)")
    p.add_argument("--json", type=Path, default=None, help="also write the table's numbers here (a new file)")
    args = p.parse_args(argv)
    missing = [str(d) for d in args.paths[:1 if args.what == "collect" else None] if not (d / "metrics.jsonl").is_file()]
    if missing or (args.what == "collect" and len(args.paths) != 2):
        print(f"error: paths: {'no metrics.jsonl in ' + ', '.join(missing) if missing else 'collect takes RUN_DIR DEST'}",
              file=sys.stderr)
        return 2
    if args.json is not None and args.json.exists():
        print(f"error: --json: {args.json} exists; give a new file", file=sys.stderr)
        return 2
    if args.what == "collect":
        print("\n".join(str(f) for f in collect(*args.paths)))
        return 0
    runs = [load(d) for d in args.paths]
    if args.what == "aux-free":
        groups: dict[str, list[dict]] = {}
        for run in runs:
            groups.setdefault(rate_label(run), []).append(run)
        data = {label: aux_free_row(rs) for label, rs in groups.items()}
        table = aux_free_table(data)
    else:
        data = [monitor_row(r) for r in runs]
        table = monitor_table(data)
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": [str(d) for d in args.paths], "rows": data}, indent=1) + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
