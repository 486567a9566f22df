"""One training run with every optimizer step timed, for benchmarks/finetune_runs.py's router part.

    python -m benchmarks.finetune_step_worker <run dir> <out.json> <train.py override> ...

Runs the real trainer (`moe.train.train`, the overrides given as train.py takes them) and wraps
`Trainer.train_step`, so each step's wall time (`perf_counter`) and CPU time (`process_time`,
user + sys of this process) is exactly one optimizer step: forward, backward, clip, AdamW, zero_grad,
without start-up, validation or checkpoint writing. It also records the trainable parameter count,
the optimizer's state bytes (AdamW's moments of the trainable parameters: what freezing saves),
the resident memory when the first step starts and the process's peak resident memory (VmHWM).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from moe.config import load_config
from moe.train import JobInfo, train
from moe.train.loop import Trainer

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def proc_status_mb(field: str) -> float:
    """A `VmRSS` / `VmHWM` line of /proc/self/status, in MiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of every tensor in the optimizer's per-parameter state (AdamW: exp_avg, exp_avg_sq, step)."""
    return sum(v.numel() * v.element_size() for state in optimizer.state.values() for v in state.values()
               if hasattr(v, "element_size"))


def timed_run(run_dir: Path, overrides: list[str]) -> dict:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = load_config(compose(config_name="config", overrides=overrides))
    rec: dict = {"step_wall_s": [], "step_cpu_s": [], "rss_at_first_step_mb": None}
    plain_step = Trainer.train_step

    def timed_step(self):
        if rec["rss_at_first_step_mb"] is None:
            rec["rss_at_first_step_mb"] = proc_status_mb("VmRSS")
        w0, c0 = time.perf_counter(), time.process_time()
        out = plain_step(self)
        rec["step_wall_s"].append(time.perf_counter() - w0)
        rec["step_cpu_s"].append(time.process_time() - c0)
        rec["optimizer_state_bytes"] = optimizer_state_bytes(self.optimizer)
        rec["trainable_params"] = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        return out

    Trainer.train_step = timed_step
    try:
        summary = train(cfg, run_dir, JobInfo(overrides=list(overrides)))
    finally:
        Trainer.train_step = plain_step
    rec["peak_rss_mb"] = proc_status_mb("VmHWM")
    rec["params"] = summary["params"]
    rec["final_val_loss"] = summary.get("final_val_loss")
    rec["initial_val_loss"] = summary.get("initial_val_loss")
    return rec


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("error: usage: python -m benchmarks.finetune_step_worker <run dir> <out.json> [override ...]",
              file=sys.stderr)
        return 2
    run_dir, out = Path(argv[0]), Path(argv[1])
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    rec = timed_run(run_dir, argv[2:])
    out.write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
