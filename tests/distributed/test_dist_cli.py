"""The commands of docs/guides/data.md: `python -m moe.data.prepare ...` (a distributed run without prepared data
stops at once), `torchrun --nproc_per_node=2 train.py distributed=ep ...`, then the
same run continued by `python train.py distributed=fsdp train.resume=auto` (a world of one:
no torchrun needed), each through Hydra."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.distributed.dist_helpers import CORPUS, torchrun, worker_env


@pytest.mark.slow
def test_torchrun_train_py_then_resume_on_one_process(tmp_path):
    out = tmp_path / "outputs"
    common = ["data=text", f"data.path={CORPUS}", "data.vocab_size=320", "data.max_chars=50000",
              f"data.cache_dir={tmp_path / 'cache'}", "data.num_proc=1", "model.d_model=32", "model.n_layers=1",
              "model.n_experts=4", "train.batch_size=4", "train.grad_accum=2", "train.seq_len=16",
              "train.log_interval=2", "train.eval_interval=2", "train.eval_batches=1", "train.ckpt_interval=2",
              "train.max_steps=4", "train.peak_flops=1e9", "logger=none", "distributed.timeout_s=120"]
    # Distributed runs only read prepared data: without it every rank stops at once, saying how to prepare it.
    p = torchrun(["train.py", *common, "distributed=ep", "distributed.ep_size=2", f"hydra.run.dir={out}/none"],
                 tmp_path)
    assert p.returncode != 0 and "python -m moe.data.prepare" in p.stderr, p.stderr[-3000:]
    p = subprocess.run([sys.executable, "-m", "moe.data.prepare", *common], cwd=REPO, env=worker_env(),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "prepared: " in p.stdout, p.stderr[-3000:]
    p = torchrun(["train.py", *common, "distributed=ep", "distributed.ep_size=2", "train.stop_after=2",
                  f"hydra.run.dir={out}/first"], tmp_path)
    assert p.returncode == 0, p.stderr[-4000:]
    # no deprecation warnings on every rank (DDP's broadcast_buffers, torch.distributed.nn's all_reduce)
    assert "Warning:" not in p.stderr, p.stderr[-4000:]
    first = out / "first"
    log = (first / "train.log").read_text()
    assert "distributed=ep: 2 processes (gloo)" in log and "2 experts per rank" in log
    assert log.count("step 2/4 |") == 1  # rank 0 alone logs (the progress line; the closing summary says "step 2/4" too)
    recs = [json.loads(line) for line in (first / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 2]  # one writer
    ckpt = first / "checkpoints" / "step_0000002"
    assert (ckpt / ".metadata").is_file() and (ckpt / "meta.pt").is_file()

    p = subprocess.run([sys.executable, "train.py", *common, "distributed=fsdp", "train.resume=auto",
                        f"hydra.run.dir={out}/second"], cwd=REPO, env=worker_env(), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "resumed from" in (first / "train.log").read_text() and not (out / "second").exists()
    recs = [json.loads(line) for line in (first / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 2, 4]
    assert (first / "checkpoints" / "step_0000004" / "meta.pt").is_file()


@pytest.mark.slow
def test_impossible_layout_stops_every_rank(dist_runs, tmp_path):
    """Every rank refuses ep_size 4 on 2 processes at start (a job of the shared launch, tests/distributed/
    conftest.py; the exit status of a refused torchrun train.py is the no-prepared-data launch above)."""
    for rank in (0, 1):
        said = (dist_runs["refused"] / f"ep4.rank{rank}.txt").read_text()
        assert "the world size 2 must be divisible by distributed.ep_size=4" in said, (rank, said)
    assert not (dist_runs["refused"].parent / "refused_run").exists()
