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
from datetime import datetime
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


def stamp(line: str) -> datetime:
    """The time of a Hydra log line `[2026-12-03 17:31:34,250][...` or a sacct field `2026-12-03T17:31:34`."""
    text = line[1:24] if line.startswith("[") else line
    return datetime.fromisoformat(text.replace(",", ".").replace("T", " "))


def time_limit_timeline(sacct: list[str], train_log: list[str]) -> dict:
    """Seconds from the first attempt's start to SLURM's signal, from the requeue to the second
    attempt's start (SLURM's BeginTime hold and scheduling), and the second attempt's length."""
    attempts = [ln.split("|") for ln in sacct[1:] if ln.split("|")[0].isdigit()]
    signal = stamp(next(ln for ln in train_log if "Caught signal SIGUSR2" in ln))
    requeued = stamp(next(ln for ln in train_log if "Requeued job" in ln))
    first, second = stamp(attempts[0][5]), stamp(attempts[1][5])
    return {"attempt_states": [a[4] for a in attempts], "signal_after_start_s": (signal - first).total_seconds(),
            "requeue_to_second_start_s": (second - requeued).total_seconds(),
            "second_attempt_elapsed": attempts[1][7]}


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
        logs = {str(p.relative_to(sweep)): lines(p, tmp) for p in sorted((sweep / ".submitit").rglob("*_log.*"))}
        events[name] = {"job_id": job_id, "sacct": sacct, "train_log": lines(sweep / "0" / "train.log", tmp),
                        "submitit_logs": logs, "val_loss": [r.get("val/loss") for r in metrics(sweep / "0")],
                        "train_loss": [r["train/loss"] for r in metrics(sweep / "0") if "train/loss" in r]}
    for name in ("reference", "reference_jitter"):
        m = metrics(root / name)
        events[name] = {"val_loss": [r.get("val/loss") for r in m], "train_loss": [r["train/loss"] for r in m
                                                                                    if "train/loss" in r]}
    events["time_limit"]["timeline"] = time_limit_timeline(events["time_limit"]["sacct"],
                                                           events["time_limit"]["train_log"])
    events["ddp"]["largest_relative_difference_from_reference"] = largest_relative_differences(
        metrics(root / "reference"), metrics(root / "ddp" / "0"))
    events["time_limit"]["largest_relative_difference_from_reference_jitter"] = largest_relative_differences(
        metrics(root / "reference_jitter"), metrics(root / "time_limit" / "0"))
    (out / "ddp_timelimit_events.json").write_text(json.dumps(events, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
