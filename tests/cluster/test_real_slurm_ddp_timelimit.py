"""A 2-task DDP job and a real time limit on a real SLURM: opt-in with the requeue tests (a time
limit is at least a minute, its requeue another ~120 s of SLURM's BeginTime hold). Run with

    MOE_LAB_SLURM_REQUEUE_TESTS=1 python -m pytest -q tests/cluster/test_real_slurm_ddp_timelimit.py

(about 4 minutes on 2 CPUs; a recorded run: docs/results/slurm/). Runs of one training config
(6 steps, checkpoint every 4), compared with each other:

  reference   a plain `train.py` run on this machine, one process, no SLURM (and one with router
              jitter, so that the RNG state is part of what the time-limited job must resume)
  ddp         a sweep of one job, `distributed=ddp` over 2 SLURM tasks (srun, 1 CPU each, gloo): its
              metrics equal the reference's within RTOL (see below)
  time limit  a sweep of one job, `cluster.timeout_min=1 cluster.signal_delay_s=5`, held at the end
              of step 5 of its first attempt until SLURM's own time-limit signal (USR2, no signal sent by
              the test) stops it: the trainer checkpoints step 5, submitit counts a time-out and
              requeues it, the second attempt resumes step 5 and logs exactly what the reference logs.

DDP tolerance, as in tests/distributed/test_parallel.py: the two ranks compute the same sums in a
different order (per-rank means averaged, gradients all-reduced) and fp32 rounds each order
differently (~2e-7 relative there); RTOL = 1e-5 while a real error (a wrong batch shard, a gradient
off by the world size) is ~1e-2 or more. The global balance loss (moe/distributed/balance.py) makes
the aux loss the single-process one. Expert loads are counts: a tie flipped by fp32 reordering may
move an assignment or two (LOAD_ATOL).

SLURM sends `--signal=USR2@5` "up to 60 seconds earlier than specified" (sbatch(1): it checks its
jobs periodically); seen 43-53 s into the job here, after the start-up (~10 s) and before SLURM's own
kill at the limit. Should it come before step 5, the job is still correct but takes another path
(resumed from an earlier step, held again in its second attempt): the test then fails on its
`attempts == 2` / `step_0000005` assertions, saying so."""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest

from tests.cluster.helpers import job_logs, prepare_corpus, read_metrics, train_py
from tests.cluster.real_slurm import requires_slurm, slurm_overrides, sweep_state

OPT_IN = "MOE_LAB_SLURM_REQUEUE_TESTS"  # the same switch as test_real_slurm_requeue.py's
pytestmark = [pytest.mark.slow, requires_slurm,
              pytest.mark.skipif(os.environ.get(OPT_IN) != "1",
                                 reason=f"a time limit and its requeue take minutes: set {OPT_IN}=1")]
SKIPPED = ("perf/",)  # wall-clock throughput
RTOL = 1e-5
LOAD_ATOL = 2 / (4 * 16) + 1e-12  # two of the step's batch x seq_len tokens
DISCRETE = ("load_max", "load_min", "load_cv", "load_imbalance", "load_entropy_norm", "dead_experts", "dropped_frac",
            "routing_stability", "train_eval_overlap")
# Router jitter makes the RNG state part of what a resume must restore; it is off in the DDP
# comparison, where each rank draws the noise of its own half of the batch (not one process's draw).
JITTER = ["router.jitter=0.01"]
DDP = ["distributed=ddp", "distributed.timeout_s=300", "cluster.tasks_per_node=2", "cluster.mem_gb=2"]
TIME_LIMIT = ["cluster.timeout_min=1", "cluster.signal_delay_s=5"]


def replacing(base: list[str], *new: str) -> list[str]:
    """`base` with the overrides of the same keys as `new` replaced by them."""
    keys = {o.split("=", 1)[0] for o in new}
    return [o for o in base if o.split("=", 1)[0] not in keys] + list(new)


def run_sweep(args: list[str], result: dict, name: str) -> threading.Thread:
    runner = threading.Thread(target=lambda: result.setdefault(name, train_py(["-m", *args], timeout=1200)))
    runner.start()
    return runner


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp_timelimit")
    cache, markers = tmp / "cache", tmp / "markers"
    markers.mkdir()
    prepare_corpus(cache)
    dirs = {name: tmp / name for name in ("reference", "reference_jitter", "ddp", "time_limit")}
    base = slurm_overrides(cache, dirs["ddp"], steps=6, ckpt=4)
    result: dict = {}
    threads = [run_sweep(replacing(base, *DDP), result, "ddp"),
               run_sweep(replacing(base, *JITTER, *TIME_LIMIT, f"hydra.sweep.dir={dirs['time_limit']}",
                                   "+hydra.callbacks.pause._target_=tests.cluster.pause_callback.PauseFirstAttempt",
                                   "+hydra.callbacks.pause.points={0:late}",
                                   f"+hydra.callbacks.pause.marker_dir={markers}"), result, "time_limit")]
    # The references: the same training, one plain process outside SLURM (no launcher, no cluster.*).
    plain = [o for o in base if not o.startswith(("hydra/launcher=", "hydra.sweep.dir=", "cluster."))]
    result["reference"] = train_py([*plain, f"hydra.run.dir={dirs['reference']}"], timeout=600)
    result["reference_jitter"] = train_py([*plain, *JITTER, f"hydra.run.dir={dirs['reference_jitter']}"], timeout=600)
    for t in threads:
        t.join(1300)
    for name, p in result.items():
        print(f"--- {name}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    for name, path in dirs.items():
        assert result[name].returncode == 0, (name, result[name].stderr[-3000:] + (
            job_logs(path) if name in ("ddp", "time_limit") else ""))
    return {name: (path / "0" if name in ("ddp", "time_limit") else path) for name, path in dirs.items()} | {
        "sweeps": dirs, "markers": markers}


def test_the_ddp_job_ran_two_tasks_and_is_done(runs):
    state = sweep_state(runs["sweeps"]["ddp"])
    job = state["jobs"][0]
    assert state["counts"]["done"] == 1 and job["processes"] == 2 and job["attempts"] == 1, json.dumps(state)
    assert state["submission"]["resources"]["tasks_per_node"] == 2
    log = (runs["ddp"] / "train.log").read_text()
    assert "distributed=ddp: 2 processes (gloo)" in log
    array = job["job_id"].split("_")[0]
    steps = subprocess.run(["sacct", "-n", "-P", "-o", "JobID,NTasks,State", "-j", array], capture_output=True,
                           text=True).stdout
    # the training step of the job: srun's step .0 with 2 tasks
    assert any(ln.split("|")[1:] == ["2", "COMPLETED"] and ".0" in ln.split("|")[0] for ln in steps.split()), steps


def ddp_differences(ref: list[dict], ddp: list[dict]) -> list[tuple]:
    """(step, key, one process's value, the DDP job's) for every logged value outside its tolerance:
    RTOL for the losses, norms, entropies and the learning rate; LOAD_ATOL for the token-count
    fractions (expert loads, routing stability, train/eval overlap), where a flipped tie moves a token."""
    out = []
    for ra, rb in zip(ref, ddp):
        for k in sorted(k for k in ra if not k.startswith(SKIPPED)):
            a, b = ra[k], rb.get(k)
            discrete = k.rsplit("/", 1)[-1] in DISCRETE
            if b != pytest.approx(a, rel=0 if discrete else RTOL, abs=LOAD_ATOL if discrete else 0):
                out.append((ra["step"], k, a, b))
    return out


def test_the_ddp_job_logs_what_one_process_logs(runs):
    ref, ddp = read_metrics(runs["reference"]), read_metrics(runs["ddp"])
    assert [r["step"] for r in ddp] == [r["step"] for r in ref] == [0, 2, 4, 6]
    for ra, rb in zip(ref, ddp):
        assert {k for k in ra if not k.startswith(SKIPPED)} == {k for k in rb if not k.startswith(SKIPPED)}
    assert ddp_differences(ref, ddp) == []
    assert sum(len(r) for r in ref) >= 100  # every step's losses, router statistics and validation compared


def test_the_time_limited_job_was_requeued_once_by_its_time_limit(runs):
    state = sweep_state(runs["sweeps"]["time_limit"])
    job = state["jobs"][0]
    assert state["counts"]["done"] == 1, json.dumps(state)
    assert job["attempts"] == 2 and job["requeues"] == 1 and job["error"] is None and job["final"]["step"] == 6
    assert (runs["markers"] / "paused_0").exists()  # the first attempt was held at step 5 until the signal
    logs = job_logs(runs["sweeps"]["time_limit"])
    # SLURM's --signal=USR2@5, which submitit's handler classes as a time-out (counted against max_requeues)
    assert "Caught signal SIGUSR2" in logs and "this job is timed-out" in logs, logs[-4000:]
    assert "(2 remaining timeouts)" in logs  # cluster.max_requeues=3, one used


def test_the_time_limited_job_resumed_and_logs_what_an_uninterrupted_run_logs(runs):
    ref, run = read_metrics(runs["reference_jitter"]), read_metrics(runs["time_limit"])
    assert [r["step"] for r in run] == [r["step"] for r in ref] == [0, 2, 4, 6]
    for ra, rb in zip(ref, run):
        keys = {k for k in ra if not k.startswith(SKIPPED)}
        assert keys == {k for k in rb if not k.startswith(SKIPPED)}
        assert all(rb[k] == ra[k] for k in keys), (ra["step"], [k for k in keys if rb[k] != ra[k]])
    log = (runs["time_limit"] / "train.log").read_text()
    assert "(stopped early: SIGUSR2 (preemption or time limit))" in log
    assert "resumed from" in log and "step_0000005" in log
