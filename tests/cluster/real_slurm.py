"""Shared pieces of the tests against a real SLURM (the one-node cluster of .ci/slurm/start.sh)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster.helpers import data_overrides


def skip_reason() -> str | None:
    """Why no real SLURM can be used here (None: it can)."""
    if shutil.which("sbatch") is None:
        return "no SLURM on this machine (sbatch not found); start one with `bash .ci/slurm/start.sh` (root, apt-get)"
    checks = [(["scontrol", "ping"], "UP", "slurmctld does not answer `scontrol ping`"),
              (["sacct", "-n", "-X", "-S", "now"], None, "sacct does not answer (slurmdbd down?); submitit needs it"),
              (["sinfo", "-h", "-o", "%t"], "idle", "no idle node (`sinfo`)")]
    for cmd, expect, why in checks:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return why
        if out.returncode != 0 or (expect and expect not in out.stdout and "mix" not in out.stdout):
            return why
    return None


requires_slurm = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


def slurm_overrides(cache: Path, sweep_dir: Path, steps: int = 4, ckpt: int = 4) -> list[str]:
    """A `steps`-step run of a 1-layer, d_model 32 MoE, one process per job (1 CPU, 1 GB), on the
    test cluster's partition (MaxTime 60 min)."""
    return [*data_overrides(cache), "model.d_model=32", "model.n_layers=1", "model.n_experts=4",
            "model.expert_hidden=32", "model.max_seq_len=64", "train.batch_size=4", "train.seq_len=16",
            f"train.max_steps={steps}", "train.log_interval=2", "train.eval_interval=2", "train.eval_batches=1",
            f"train.ckpt_interval={ckpt}", "train.peak_flops=1e9", "optim.warmup_steps=2", "logger=none",
            "hydra/launcher=submitit_slurm", "cluster.gpus_per_node=0", "cluster.tasks_per_node=1",
            "cluster.cpus_per_task=1", "cluster.mem_gb=1", "cluster.timeout_min=10", f"hydra.sweep.dir={sweep_dir}"]


def sweep_state(sweep_dir: Path) -> dict:
    return json.loads((sweep_dir / "sweep.json").read_text())


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
