"""Collect the record of one run of tests/cluster/test_real_slurm_ddp_timelimit.py from its kept
directories (pytest --basetemp=DIR): both sweeps' sweep.json, the stop/resume/signal log lines,
sacct's view of the jobs (every attempt: -D), the logged losses, and the DDP job's largest
relative difference from the one-process run per metric. Paths are shown as <tmp>.

    python docs/results/slurm/collect_ddp_timelimit.py DIR/ddp_timelimit0 docs/results/slurm/
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

KEEP = ("Caught signal", "timed-out", "Job has timed out", "Requeued job", "stopped at step", "run finished",
        "resumed from", "distributed=ddp", "Starting with JobEnvironment", "Exiting gracefully")


def lines(path: Path, tmp: str) -> list[str]:
    return [ln.replace(tmp, "<tmp>") for ln in path.read_text().splitlines() if any(k in ln for k in KEEP)]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]


def largest_relative_differences(ref: list[dict], other: list[dict]) -> dict:
    out: dict = {}
    for ra, rb in zip(ref, other):
        for k, a in ra.items():
            if k.startswith("perf/") or not isinstance(a, (int, float)):
                continue
            rel = abs(rb[k] - a) / abs(a) if a else abs(rb[k])
            out[k] = max(out.get(k, 0.0), rel)
    return dict(sorted(out.items()))


def main(root: Path, out: Path) -> None:
    tmp = str(root)
    events: dict = {}
    for name in ("ddp", "time_limit"):
        sweep = root / name
        state = json.loads((sweep / "sweep.json").read_text().replace(tmp, "<tmp>"))
        (out / f"{name}_sweep.json").write_text(json.dumps(state, indent=1) + "\n")
        job_id = state["jobs"][0]["job_id"]
        sacct = subprocess.run(["sacct", "-D", "-P", "-o", "JobID,JobName,NTasks,AllocCPUS,State,Start,End,Elapsed,"
                                "Timelimit", "-j", job_id], capture_output=True, text=True).stdout.splitlines()
        logs = {str(p.relative_to(sweep)): lines(p, tmp) for p in sorted((sweep / ".submitit").rglob("*_log.err"))}
        events[name] = {"job_id": job_id, "sacct": sacct, "train_log": lines(sweep / "0" / "train.log", tmp),
                        "submitit_logs": logs, "val_loss": [r.get("val/loss") for r in metrics(sweep / "0")],
                        "train_loss": [r["train/loss"] for r in metrics(sweep / "0") if "train/loss" in r]}
    for name in ("reference", "reference_jitter"):
        m = metrics(root / name)
        events[name] = {"val_loss": [r.get("val/loss") for r in m], "train_loss": [r["train/loss"] for r in m
                                                                                    if "train/loss" in r]}
    events["ddp"]["largest_relative_difference_from_reference"] = largest_relative_differences(
        metrics(root / "reference"), metrics(root / "ddp" / "0"))
    events["time_limit"]["largest_relative_difference_from_reference_jitter"] = largest_relative_differences(
        metrics(root / "reference_jitter"), metrics(root / "time_limit" / "0"))
    (out / "ddp_timelimit_events.json").write_text(json.dumps(events, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
