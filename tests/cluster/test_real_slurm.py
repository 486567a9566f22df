"""The launcher against a real SLURM (the one-node cluster of `.ci/slurm/start.sh`; skipped, saying
why, where none answers). About 40 s in all: one small sweep, each resource mistake refused before
submission, a job that can never start cancelled, a cancelled pending array that does not leave
the command waiting. The requeue tests (each ~120 s of SLURM's BeginTime hold) are opt-in:
tests/cluster/test_real_slurm_requeue.py."""

from __future__ import annotations

import math
import subprocess
import threading

import pytest

from tests.cluster.helpers import job_logs, prepare_corpus, read_metrics, train_py
from tests.cluster.real_slurm import requires_slurm, slurm_overrides, sweep_state, wait_for

pytestmark = [pytest.mark.slow, requires_slurm]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    prepare_corpus(cache)
    return cache


def test_a_two_job_sweep_runs_on_slurm(cache, tmp_path):
    sweep = tmp_path / "sweep"
    p = train_py(["-m", "router.top_k=1,2", *slurm_overrides(cache, sweep)], timeout=300)
    assert p.returncode == 0, p.stderr[-3000:] + job_logs(sweep)
    state = sweep_state(sweep)
    assert state["counts"]["done"] == 2
    sub = state["submission"]
    assert sub["executor"] == "slurm" and sub["partition"] == "debug" and sub["resources"]["timeout_min"] == 10
    array = sub["job_ids"]["0"].split("_")[0]
    assert sub["job_ids"] == {"0": f"{array}_0", "1": f"{array}_1"}
    for job in state["jobs"]:
        assert job["attempts"] == 1 and job["requeues"] == 0 and job["error"] is None
        assert job["job_id"] == sub["job_ids"][str(job["num"])]
        recs = read_metrics(sweep / str(job["num"]))
        assert [r["step"] for r in recs] == [0, 2, 4] and math.isfinite(recs[-1]["val/loss"])
        assert job["final"]["final_val_loss"] == recs[-1]["val/loss"]
    sacct = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", array], capture_output=True,
                           text=True).stdout
    assert sorted(sacct.split()) == [f"{array}_0|COMPLETED", f"{array}_1|COMPLETED"]


@pytest.mark.parametrize("override, message", [
    ("cluster.partition=gpu", "error: cluster.partition=gpu: no such partition on this cluster (partitions: debug)"),
    ("cluster.gpus_per_node=1", "error: cluster.gpus_per_node=1: the nodes of partition debug have at most 0 GPUs"),
    ("cluster.cpus_per_task=64", "error: cluster.cpus_per_task=64 x cluster.tasks_per_node=1 = 64 CPUs per node: "
                                 "the nodes of partition debug have at most "),
    ("cluster.mem_gb=100000", "error: cluster.mem_gb=100000: the nodes of partition debug have at most "),
    ("cluster.timeout_min=240", "error: cluster.timeout_min=240: partition debug allows at most 60 minutes "
                                "(MaxTime=01:00:00)"),
    ("cluster.account=nobody", "error: cluster.account=nobody: you (root) have no association with it"),
    ("cluster.qos=high", "error: cluster.qos=high: not allowed for your association on this cluster"),
    ("cluster.timeout_min=abc", "error: cluster.timeout_min='abc': expected a whole number"),
])
def test_each_resource_mistake_is_one_line_before_submission(cache, tmp_path, override, message):
    sweep = tmp_path / "sweep"
    p = train_py(["-m", *slurm_overrides(cache, sweep), override], timeout=120)
    assert p.returncode == 2 and p.stderr.startswith(message) and p.stderr.count("\n") == 1, p.stderr[-2000:]
    assert not sweep.exists()  # nothing submitted, nothing left behind


def test_a_job_that_can_never_start_is_cancelled_with_its_reason(cache, tmp_path):
    """`hydra.launcher.timeout_min` (set past the cluster.* check) exceeds the partition's MaxTime: SLURM
    accepts the job and keeps it pending (PartitionTimeLimit) forever; the launcher cancels it."""
    sweep = tmp_path / "sweep"
    p = train_py(["-m", *slurm_overrides(cache, sweep), "hydra.launcher.timeout_min=240"], timeout=120)
    assert p.returncode == 1, p.stderr[-2000:]
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 2 and "never started: PartitionTimeLimit" in errors[0], p.stderr[-2000:]
    job = sweep_state(sweep)["jobs"][0]
    assert job["state"] == "failed" and "SLURM: CANCELLED (never started: PartitionTimeLimit" in job["error"]


def test_a_cancelled_pending_array_does_not_leave_the_command_waiting(cache, tmp_path):
    """Two jobs held (`--begin=now+600`), listed by sacct as one line `N_[0-1] ...`; scancel ends both."""
    sweep = tmp_path / "sweep"
    result = {}
    cmd = ["-m", "router.top_k=1,2", *slurm_overrides(cache, sweep),
           "+hydra.launcher.additional_parameters.begin=now+600"]
    runner = threading.Thread(target=lambda: result.setdefault("p", train_py(cmd, timeout=120)))
    runner.start()
    array = wait_for(lambda: (sweep / "sweep.json").exists() and sweep_state(sweep).get("submission"), 60,
                     "the submission")["job_ids"]["0"].split("_")[0]
    subprocess.run(["scancel", array], check=True)
    runner.join(90)
    assert not runner.is_alive(), "the sweep command still waits for a cancelled array"
    p = result["p"]
    assert p.returncode == 1 and "error: 2 of 2 sweep job(s) failed" in p.stderr, p.stderr[-2000:]
    state = sweep_state(sweep)
    assert state["counts"]["failed"] == 2
    assert all(j["error"].startswith("SLURM: CANCELLED") for j in state["jobs"])
