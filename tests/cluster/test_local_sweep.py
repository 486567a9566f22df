"""A sweep through `hydra/launcher=submitit_local` on CPU: each job is 2 training processes (ddp, gloo)
started by submitit's LocalExecutor, as srun starts them on a cluster.

One sweep of two jobs, identical but for their W&B run name, serves both checks (each job start
costs several seconds of imports on 2 cores, so the tests share it):

- the sweep: both jobs train completely, rank 0 alone writes each run directory, `sweep.json` lists
  both jobs done with their overrides, the varying value and their final metrics, the W&B group and
  tags name the sweep and the varying value, and `benchmarks.sweep_report` reads the sweep;
- a preemption: job 1's rank 0 receives the cluster's preemption signal during step 3
  (tests/cluster/preempt_callback.py); both ranks stop at the end of step 3 with a checkpoint,
  submitit's hook requeues the job (locally), it resumes with `train.resume=auto` and logs exactly
  what the uninterrupted job 0 logs.
"""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.sweep_report import write_report
from moe.checkpoint import list_checkpoints
from tests.cluster.helpers import job_logs, prepare_corpus, read_metrics, tiny_overrides, train_py

EXACT_KEYS_SKIPPED = ("perf/",)  # wall-clock throughput differs between any two runs


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The tokenised corpus, prepared once here so the jobs' processes find it cached."""
    cache = tmp_path_factory.mktemp("cache")
    prepare_corpus(cache)
    return cache


@pytest.fixture(scope="module")
def sweep(cache, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("launcher")
    sweep, marker = tmp / "sweep", tmp / "signal_sent"
    p = train_py(["-m", "hydra/launcher=submitit_local", "logger.run_name=reference,preempted", "router.jitter=0.01",
                  *tiny_overrides(cache, sweep),
                  "+hydra.callbacks.preempt._target_=tests.cluster.preempt_callback.PreemptOnce",
                  "+hydra.callbacks.preempt.job_num=1", "+hydra.callbacks.preempt.at_step=3",
                  f"+hydra.callbacks.preempt.marker={marker}"])
    assert p.returncode == 0, p.stderr[-3000:] + job_logs(sweep)
    assert marker.is_file(), "the preemption signal was never sent"
    return sweep


@pytest.mark.slow
def test_two_job_sweep_through_submitit_local(sweep):
    state = json.loads((sweep / "sweep.json").read_text())
    assert state["counts"] == {"pending": 0, "running": 0, "requeued": 0, "done": 2, "failed": 0}
    assert [j["num"] for j in state["jobs"]] == [0, 1]
    for job, name in zip(state["jobs"], ("reference", "preempted")):
        run = sweep / str(job["num"])
        assert job["state"] == "done" and job["run_dir"] == str(run) and job["error"] is None
        assert job["varying"] == {"logger.run_name": name} and f"logger.run_name={name}" in job["overrides"]
        assert job["processes"] == 2 and job["job_id"] and job["log"].endswith("_0_log.out")
        recs = read_metrics(run)
        assert [r["step"] for r in recs] == [0, 2, 4]  # one writer: rank 0
        assert [r["step"] for r in recs if "train/loss" in r] == [2, 4]
        val = [r["val/loss"] for r in recs if "val/loss" in r]
        assert len(val) == 3 and all(math.isfinite(v) for v in val)
        assert job["final"]["final_val_loss"] == val[-1] and job["final"]["step"] == 4
        assert job["final"]["train_loss"] == recs[-1]["train/loss"]
        cfg = json.loads((run / "config.json").read_text())
        assert cfg["distributed"]["name"] == "ddp" and cfg["cluster"]["tasks_per_node"] == 2
        assert cfg["logger"]["group"] == "sweep" and f"logger.run_name={name}" in cfg["logger"]["tags"]
        log = (run / "train.log").read_text()
        assert "distributed=ddp: 2 processes (gloo)" in log and log.count("step 4/4 |") == 1  # the progress line (the closing summary names the step too)
        assert list_checkpoints(run)[-1].name == "step_0000004"  # a 2-process (DCP) checkpoint
        assert (list_checkpoints(run)[-1] / ".metadata").is_file()


@pytest.mark.slow
def test_sweep_report_reads_a_launcher_sweep(sweep, tmp_path):
    md, png, table = write_report(sweep, tmp_path / "report")
    rows = [r for r in table.splitlines() if r.startswith("| `")]
    state = json.loads((sweep / "sweep.json").read_text())
    finals = [j["final"]["final_val_loss"] for j in state["jobs"]]
    assert len(rows) == 1 and rows[0].startswith("| `topk` | 2 |")  # the run name is not a variant
    assert f"{sum(finals) / 2:.4f} ± 0.0000" in rows[0]
    text = md.read_text()
    assert "## Jobs" in text and "2 done (from sweep.json)" in text
    assert f"| 0 | done | `logger.run_name=reference` | {finals[0]:.4f} | 1 |" in text
    assert f"| 1 | done | `logger.run_name=preempted` | {finals[1]:.4f} | 2 |" in text
    assert png.stat().st_size > 5000


@pytest.mark.slow
def test_preempted_job_is_requeued_and_resumes_exactly(sweep):
    state = json.loads((sweep / "sweep.json").read_text())
    ref_job, job = state["jobs"]
    assert ref_job["state"] == job["state"] == "done"
    assert ref_job["attempts"] == 1 and ref_job["requeues"] == 0
    assert job["attempts"] == 2 and job["requeues"] == 1  # stopped once, requeued once
    ref, run = sweep / "0", sweep / "1"
    log = (run / "train.log").read_text()
    assert "stopped at step 3 for the preemption signal" in log and "resumed from" in log
    # the requeued job resumed its own checkpoint of step 3 (written only because of the signal)
    assert "train.resume=auto" in (run / ".hydra" / "overrides.yaml").read_text()
    assert [p.name for p in list_checkpoints(run)] == ["step_0000003", "step_0000004"]
    assert [p.name for p in list_checkpoints(ref)] == ["step_0000004"]
    # every logged value but wall-clock throughput equals the uninterrupted job's
    a, b = read_metrics(ref), read_metrics(run)
    assert [r["step"] for r in b] == [r["step"] for r in a] == [0, 2, 4]
    for ra, rb in zip(a, b):
        ka = {k for k in ra if not k.startswith(EXACT_KEYS_SKIPPED)}
        assert ka == {k for k in rb if not k.startswith(EXACT_KEYS_SKIPPED)}
        for k in ka:
            assert rb[k] == ra[k], (ra["step"], k, ra[k], rb[k])
    assert job["final"]["final_val_loss"] == ref_job["final"]["final_val_loss"]
