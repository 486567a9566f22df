"""Tiny training runs for the resume and fault tests, identical through `python train.py` and
in-process `train()`: both take their config from Hydra's composition of the same overrides."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from moe.config import Config, load_config
from tests.conftest import REPO, SHARED_DATA

CORPUS = SHARED_DATA / "corpus" / "tinyshakespeare.txt"
MAX_STEPS = 10
# Logged every 2 steps, validated and checkpointed every 4: steps 1, 3, 5 are none of them,
# 2 and 6 log only, 4 and 8 do everything, 10 is the end.
ARGS = ["data=text", f"data.path={CORPUS}", "data.vocab_size=320", "data.max_chars=200000", "data.num_proc=1",
        "model.d_model=32", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2", "model.n_experts=4",
        "model.expert_hidden=32", "model.max_seq_len=64", "router.top_k=2",
        "router.jitter=0.01",  # the RNG state must survive every stop too
        "train.batch_size=4", "train.seq_len=32", f"train.max_steps={MAX_STEPS}", "train.log_interval=2",
        "train.eval_interval=4", "train.eval_batches=2", "train.ckpt_interval=4", "train.keep_last=5",
        "train.peak_flops=1e9", "optim.warmup_steps=2", "logger=none"]


def run_args(cache: Path, *extra: str) -> list[str]:
    return [*ARGS, f"data.cache_dir={cache}", *extra]


def composed_cfg(cache: Path, *extra: str) -> Config:
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return load_config(compose(config_name="config", overrides=run_args(cache, *extra)))


def start_train_py(run_dir: Path, cache: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """`python train.py` in the background; its console output goes to `<run_dir>.out`."""
    out = open(f"{run_dir}.out", "w")
    full_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})}  # same threads as the reference
    return subprocess.Popen([sys.executable, "train.py", *run_args(cache, *extra), f"hydra.run.dir={run_dir}"],
                            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=full_env)


def console(run_dir: Path) -> str:
    return Path(f"{run_dir}.out").read_text()


def logged_steps(run_dir: Path) -> list[int]:
    """Steps in metrics.jsonl so far (a line being written may be torn: skipped)."""
    steps = []
    path = Path(run_dir) / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            steps.append(json.loads(line)["step"])
        except ValueError:
            pass
    return steps


def wait_until(cond, proc: subprocess.Popen, run_dir: Path, timeout: float = 300) -> None:
    t0 = time.monotonic()
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"train.py exited ({proc.returncode}) too early:\n{console(run_dir)[-3000:]}")
        if time.monotonic() - t0 > timeout:
            proc.send_signal(signal.SIGKILL)
            raise AssertionError(f"timed out waiting:\n{console(run_dir)[-3000:]}")
        time.sleep(0.05)


def strict_records(run_dir: Path) -> list[dict]:
    """metrics.jsonl read by a strict JSON reader (NaN / Infinity are not JSON)."""
    def refuse(c):
        raise AssertionError(f"non-JSON constant {c} in metrics.jsonl")
    return [json.loads(ln, parse_constant=refuse) for ln in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def without_timing(records: list[dict]) -> list[dict]:
    """The records minus the timing keys (perf/*), which no two runs share."""
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in records]


def assert_same_records(expected: list[dict], got: list[dict]) -> None:
    """The same steps, the same keys and the same values (timing aside), in both directions: a
    record or key present on one side only fails as surely as a different value."""
    a, b = without_timing(expected), without_timing(got)
    assert [r["step"] for r in b] == [r["step"] for r in a]
    for ra, rb in zip(a, b):
        assert sorted(rb) == sorted(ra), (ra["step"], sorted(set(ra) ^ set(rb)))
        for key in ra:
            assert rb[key] == ra[key], (ra["step"], key, ra[key], rb[key])
