"""Per-step cost of the model's profiling ranges when no profiler records (docs/guides/profiling.md).

Three variants of `moe.profiling.stage`, swapped in at every module that imported it, run in
interleaved rounds in one process on the same model and batch: `ranges` (the shipped function: a
flag read, then a shared no-op context), `none` (always the no-op context: no check at all) and
`bare` (always a `record_function`, what the ranges cost without the check). Each round times
`--steps` training steps (forward, backward, AdamW) of each variant by wall clock and process CPU
time; the order of the variants rotates every round. Writes one JSON file.

    python docs/results/profiling_ranges/measure.py --rounds 8 --steps 10 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.profiler import record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.train_throughput import build, make_step  # noqa: E402
from moe import profiling  # noqa: E402

_NULL = contextlib.nullcontext()
VARIANTS = {
    "ranges": profiling.stage,
    "none": lambda name: _NULL,
    "bare": lambda name: record_function(name),
}


def importers_of_stage() -> list:
    """Every loaded `moe` module holding the name `stage` bound to the shipped function."""
    return [m for n, m in sorted(sys.modules.items())
            if n.startswith("moe") and getattr(m, "stage", None) is profiling.stage]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--json", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg, model = build("tiny", vocab=4096)
    model.train()
    sites = importers_of_stage()
    step = make_step(model, is_hf=False, autocast=contextlib.nullcontext)
    x = torch.randint(0, 4096, (a.batch, a.seq))
    for _ in range(3):  # warm-up
        step(x)
    names = list(VARIANTS)
    rounds = []
    load_before = open("/proc/loadavg").read().split()[:3]
    for r in range(a.rounds):
        order = names[r % 3:] + names[:r % 3]
        row = {"round": r, "order": order}
        for v in order:
            for m in sites:
                m.stage = VARIANTS[v]
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(a.steps):
                step(x)
            row[v] = {"wall_ms_per_step": (time.perf_counter() - w0) / a.steps * 1e3,
                      "cpu_ms_per_step": (time.process_time() - c0) / a.steps * 1e3}
        rounds.append(row)
        print(r, {v: round(row[v]["cpu_ms_per_step"], 2) for v in names}, flush=True)
    for m in sites:
        m.stage = profiling.stage
    summary = {}
    for v in names:
        for k in ("wall_ms_per_step", "cpu_ms_per_step"):
            xs = [row[v][k] for row in rounds]
            summary[f"{v}_{k}"] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
    for k in ("wall_ms_per_step", "cpu_ms_per_step"):
        for v in ("none", "bare"):  # per-round ratios cancel the load of the moment
            xs = [row[v][k] / row["ranges"][k] for row in rounds]
            summary[f"{v}_over_ranges_{k}"] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
    out = {"args": vars(a), "patched_modules": [m.__name__ for m in sites],
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "torch": torch.__version__, "cpus": os.cpu_count(), "loadavg_before": load_before,
           "loadavg_after": open("/proc/loadavg").read().split()[:3], "rounds": rounds, "summary": summary}
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
