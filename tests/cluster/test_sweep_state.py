"""sweep.json under concurrent writers: jobs finishing at the same moment lose nothing."""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest

from moe.cluster.sweep_state import job_file, read_sweep, refresh_sweep_json, update_job

N_JOBS = 12


def _job_lifecycle(sweep_dir, num, barrier):
    barrier.wait()  # every job changes state at once, as jobs of a sweep finishing together do
    update_job(sweep_dir, num, state="running", attempts=1)
    update_job(sweep_dir, num, state="done", final={"final_val_loss": float(num)})


def test_concurrent_jobs_do_not_lose_each_others_entries(tmp_path):
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(N_JOBS)
    procs = [ctx.Process(target=_job_lifecycle, args=(tmp_path, n, barrier)) for n in range(N_JOBS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * N_JOBS
    state = json.loads((tmp_path / "sweep.json").read_text())
    assert state["counts"]["done"] == N_JOBS and sum(state["counts"].values()) == N_JOBS
    assert [(j["num"], j["state"], j["final"]["final_val_loss"]) for j in state["jobs"]] == \
        [(n, "done", float(n)) for n in range(N_JOBS)]
    assert read_sweep(tmp_path) == state
    assert not list(tmp_path.rglob("*.tmp"))  # every temp file was renamed into place


def test_updates_merge_fields_and_states_are_checked(tmp_path):
    update_job(tmp_path, 3, state="pending", overrides=["router.top_k=2"], attempts=0)
    update_job(tmp_path, 3, state="running", attempts=1)
    rec = json.loads(job_file(tmp_path, 3).read_text())
    assert rec["overrides"] == ["router.top_k=2"] and rec["attempts"] == 1 and rec["state"] == "running"
    with pytest.raises(ValueError, match="not one of"):
        update_job(tmp_path, 3, state="finished")
    # sweep.json is rebuilt from the job files: a stale or missing one is repaired on the next write
    (tmp_path / "sweep.json").unlink()
    assert refresh_sweep_json(tmp_path)["counts"]["running"] == 1
    assert json.loads((tmp_path / "sweep.json").read_text())["jobs"][0]["num"] == 3


def test_a_plain_sweep_has_no_state(tmp_path):
    assert read_sweep(tmp_path) is None
