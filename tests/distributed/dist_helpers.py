"""Shared pieces of the distributed tests: tiny configs, torchrun launches, metric readers."""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED_DATA

CORPUS = SHARED_DATA / "corpus" / "tinyshakespeare.txt"
WORKER = Path(__file__).resolve().parent / "dist_worker.py"
STEPS = 10
MODES = {  # the 2-process layouts compared with one process
    "ddp": dict(name="ddp"),
    "fsdp": dict(name="fsdp"),
    "ep": dict(name="ep", ep_size=2),
    "ep_fsdp": dict(name="ep", ep_size=2, fsdp=True),
    # every rank holds all experts: their gradients are summed over the 2 replicas in 50 KB buckets,
    # one per layer (gate_up 32 KB + down 16 KB: the concatenating path, two buckets per step)
    "ep_replicas": dict(name="ep", ep_size=1, ep_grad_bucket_mb=0.05),
}
ACCUM = dict(train=dict(grad_accum=4), router=dict(aux_loss_coef=0.0))


def raw_cfg(tmp: Path, **over) -> dict:
    """A tiny run as a raw config dict (d_model 32, 2 layers, 4 experts, global batch 4 x 16)."""
    raw = {
        "model": dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=32, max_seq_len=64),
        "router": dict(top_k=2, jitter=0.0),  # aux 0.01 and z 0.001 stay on: the balance loss is global
        "data": dict(name="text", path=str(CORPUS), vocab_size=320, max_chars=50_000,
                     cache_dir=str(tmp / "cache"), num_proc=1),
        "train": dict(batch_size=4, seq_len=16, max_steps=STEPS, log_interval=1, eval_interval=5, eval_batches=2,
                      ckpt_interval=5, keep_last=5, peak_flops=1e9),
        "optim": dict(lr=3e-3, warmup_steps=2),
        "logger": dict(name="none"),
        "distributed": dict(timeout_s=120),
    }
    raw = copy.deepcopy(raw)
    for section, values in over.items():
        raw.setdefault(section, {}).update(values)
    return raw


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), WANDB_MODE="offline", WANDB_SILENT="true",
               TOKENIZERS_PARALLELISM="false")
    return env


def torchrun(args: list[str], tmp: Path, nproc: int = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node=nproc <args>` on a free local port (static rendezvous)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", *args]
    return subprocess.run(cmd, cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=timeout)


def run_jobs(jobs: list[dict], tmp: Path, nproc: int = 2) -> None:
    """Train `jobs` ([{"cfg": raw, "run_dir": path}]) one after the other in one torchrun launch."""
    spec = tmp / f"spec-{free_port()}.json"
    spec.write_text(json.dumps({"jobs": jobs}))
    p = torchrun([str(WORKER), str(spec)], tmp, nproc)
    if p.returncode != 0:
        pytest.fail(f"torchrun failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")


def run_single(raw: dict, run_dir: Path) -> dict:
    """One in-process (distributed=none) run, recording expert loads like the worker does."""
    import moe.train.loop as loop
    from moe.config import load_config
    from tests.distributed.dist_worker import LoadRecordingLogger
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "Logger", LoadRecordingLogger)
        return loop.train(load_config(raw), run_dir)


def copy_run_until(src: Path, dst: Path, step: int) -> Path:
    """A copy of run `src` without its checkpoints after `step`; returns the step's checkpoint."""
    shutil.copytree(src, dst)
    ckpts = sorted((dst / "checkpoints").iterdir())
    keep = [p for p in ckpts if p.name.startswith(f"step_{step:07d}")]
    for p in ckpts:
        if p not in keep:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    return keep[0]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def read_loads(run_dir: Path) -> dict[int, list[list[float]]]:
    rows = [json.loads(line) for line in (run_dir / "loads.jsonl").read_text().splitlines()]
    return {r["step"]: r["loads"] for r in rows}


def by_step(records: list[dict], key: str) -> dict[int, float]:
    return {r["step"]: r[key] for r in records if key in r}
