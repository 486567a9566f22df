"""Shared pieces of the launcher tests: the tiny training overrides and a `python train.py -m` runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from moe.config import DataConfig
from moe.data import prepare_data
from tests.conftest import REPO, SHARED_DATA

CORPUS = SHARED_DATA / "corpus" / "tinyshakespeare.txt"


def prepare_corpus(cache: Path) -> Path:
    """Tokenise the corpus of `data_overrides(cache)` into `cache`, so the jobs' processes find it
    cached (the same data settings as those overrides)."""
    prepare_data(DataConfig(name="text", path=str(CORPUS), vocab_size=320, max_chars=50000, cache_dir=str(cache),
                            num_proc=1))
    return cache


def data_overrides(cache: Path) -> list[str]:
    return ["data=text", f"data.path={CORPUS}", "data.vocab_size=320", "data.max_chars=50000",
            f"data.cache_dir={cache}", "data.num_proc=1"]


def tiny_overrides(cache: Path, sweep_dir: Path) -> list[str]:
    """A 4-step run of a 1-layer, d_model 32 MoE, 2 processes per job (gloo): log every 2 steps,
    validate every 2, checkpoint at the end only (so any other checkpoint is a preemption's)."""
    return [*data_overrides(cache), "model.d_model=32", "model.n_layers=1", "model.n_experts=4",
            "model.expert_hidden=32", "model.max_seq_len=64", "train.batch_size=4", "train.seq_len=16",
            "train.max_steps=4", "train.log_interval=2", "train.eval_interval=2", "train.eval_batches=1",
            "train.ckpt_interval=4", "train.peak_flops=1e9", "optim.warmup_steps=2", "logger=none",
            "distributed=ddp", "distributed.timeout_s=120", "cluster.tasks_per_node=2", "cluster.gpus_per_node=0",
            "cluster.cpus_per_task=1", f"hydra.sweep.dir={sweep_dir}"]


def env(**extra: str) -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), WANDB_MODE="offline", WANDB_SILENT="true",
                TOKENIZERS_PARALLELISM="false", **extra)


def train_py(args: list[str], timeout: int = 600, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", *args], cwd=REPO, env=env(**extra_env), capture_output=True,
                          text=True, timeout=timeout)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def job_logs(sweep_dir: Path) -> str:
    """Every task's submitit log, for failure messages."""
    return "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in sorted((sweep_dir / ".submitit").rglob("*_log.*")))
