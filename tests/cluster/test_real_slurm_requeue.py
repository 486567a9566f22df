"""Preemption on a real SLURM, requeue and resume: opt-in, since SLURM holds every requeued job
~120 s (BeginTime) before it starts it again. Run with

    MOE_LAB_SLURM_REQUEUE_TESTS=1 python -m pytest -q tests/cluster/test_real_slurm_requeue.py

(about 5 minutes on 2 CPUs; a recorded run: docs/results/slurm/). One sweep of five identical jobs
(W&B offline), four of them interrupted on their first attempt:

  job 1  USR2 before its first checkpoint (after the step-0 validation): submitit's requeue
  job 2  USR2 after its first checkpoint (step 5 of 6, checkpoint of step 4): the trainer checkpoints
         step 5, submitit requeues
  job 3  SIGTERM before its first checkpoint (`scontrol requeue`: SLURM requeues it itself)
  job 4  SIGTERM after its first checkpoint (the same, the trainer checkpoints step 5 first)

Each requeued job must continue its own run directory and log exactly what job 0 (never
interrupted) logs; the sweep command must exit 0 with every job done."""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest

from tests.cluster.helpers import job_logs, prepare_corpus, read_metrics, train_py
from tests.cluster.real_slurm import requires_slurm, slurm_overrides, sweep_state, wait_for

OPT_IN = "MOE_LAB_SLURM_REQUEUE_TESTS"
pytestmark = [pytest.mark.slow, requires_slurm,
              pytest.mark.skipif(os.environ.get(OPT_IN) != "1",
                                 reason=f"requeue tests wait ~120 s per requeue (SLURM's BeginTime): set {OPT_IN}=1")]
NAMES = ("reference", "usr2_early", "usr2_late", "term_early", "term_late")
SIGNALS = {1: "usr2", 2: "usr2", 3: "term", 4: "term"}
SKIPPED = ("perf/",)  # wall-clock throughput


def job_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout
    return out.strip() or "GONE"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("requeue")
    cache, sweep, markers = tmp / "cache", tmp / "sweep", tmp / "markers"
    markers.mkdir()
    prepare_corpus(cache)
    cmd = ["-m", f"logger.run_name={','.join(NAMES)}", *slurm_overrides(cache, sweep, steps=6, ckpt=4),
           "logger=wandb", "router.jitter=0.01",
           "+hydra.callbacks.pause._target_=tests.cluster.pause_callback.PauseFirstAttempt",
           "+hydra.callbacks.pause.points={1:early,2:late,3:early,4:late}",
           f"+hydra.callbacks.pause.marker_dir={markers}"]
    result = {}
    runner = threading.Thread(target=lambda: result.setdefault("p", train_py(cmd, timeout=1500)))
    runner.start()
    job_ids = wait_for(lambda: (sweep / "sweep.json").exists() and sweep_state(sweep).get("submission"), 120,
                       "the submission")["job_ids"]
    for num, how in sorted(SIGNALS.items()):
        wait_for(lambda: (markers / f"paused_{num}").exists(), 600, f"job {num} to be held")
        job_id = job_ids[str(num)]
        cmd = ["scancel", "--signal=USR2", job_id] if how == "usr2" else ["scontrol", "requeue", job_id]
        # SLURM may answer "Job can not be altered now, try again later" (and yet deliver): until it leaves RUNNING
        wait_for(lambda: subprocess.run(cmd, capture_output=True) and job_state(job_id) != "RUNNING", 60,
                 f"job {num} to leave RUNNING after {' '.join(cmd)}", poll_s=5)
    runner.join(1500)
    p = result["p"]
    print(p.stdout[-5000:], p.stderr[-5000:])
    assert p.returncode == 0, p.stderr[-3000:] + job_logs(sweep)
    return sweep


def test_every_job_is_done_and_counted(sweep):
    state = sweep_state(sweep)
    assert state["counts"]["done"] == 5, json.dumps(state, indent=1)
    for job in state["jobs"]:
        interrupted = job["num"] in SIGNALS
        assert job["attempts"] == 1 + interrupted and job["requeues"] == int(interrupted), job
        assert job["error"] is None and job["final"]["step"] == 6


@pytest.mark.parametrize("num", sorted(SIGNALS))
def test_a_requeued_job_logs_exactly_what_an_uninterrupted_one_logs(sweep, num):
    ref, run = read_metrics(sweep / "0"), read_metrics(sweep / str(num))
    assert [r["step"] for r in run] == [r["step"] for r in ref] == [0, 2, 4, 6]
    for ra, rb in zip(ref, run):
        keys = {k for k in ra if not k.startswith(SKIPPED)}
        assert keys == {k for k in rb if not k.startswith(SKIPPED)}
        assert all(rb[k] == ra[k] for k in keys), (num, ra["step"])
    log = (sweep / str(num) / "train.log").read_text()
    if num in (2, 4):  # after the first checkpoint: resumed its own checkpoint of step 5
        assert "resumed from" in log and "step_0000005" in log
        reason = "SIGUSR2 (preemption or time limit)" if num == 2 else "SIGTERM"
        assert f"(stopped early: {reason})" in log
        # the resumed run continues the same W&B run
        ids = {p.name.rsplit("-", 1)[1] for p in (sweep / str(num) / "wandb").glob("offline-run-*")}
        assert len(ids) == 1, ids
    else:  # before it: restarted from step 0, the partial attempt moved aside
        assert "has no checkpoint yet; restarting the run from step 0" in log
        assert list((sweep / str(num)).glob("replaced_*/metrics.jsonl"))
    if num == 4:
        assert "SLURM requeues a preempted job and it resumes from this checkpoint by itself" in log
        assert "to continue, run the same command" not in log
