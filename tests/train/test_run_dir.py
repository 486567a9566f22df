"""Run directories are never silently reused, and `train.resume=auto` resumes only its own run
(moe/train/run_dir.py). These tests build run directories by hand (config.json, metrics.jsonl,
checkpoint files) and ask `plan_run` what it would do: no training needed."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from moe.config import to_dict
from moe.variants import load_config
from moe.errors import CheckpointError, ConfigError
from moe.train.run_dir import JobInfo, follow_into, log_offsets, plan_run, write_run_config


def cfg_of(**train):
    over = {k: v for k, v in train.items() if k not in ("n_experts", "top_k")}
    raw = {"model": {"n_experts": train.get("n_experts", 8)}, "router": {"top_k": train.get("top_k", 2)},
           "train": over, "logger": {"name": "none"}}
    return load_config(raw)


def resolved(cfg):
    """The config as a run saves it: model.vocab_size resolved from the tokenizer (a new run's is None)."""
    cfg.model.vocab_size = 384
    return cfg


def make_run(d: Path, cfg, steps=(4,), mtime: float | None = None, metrics=True, overrides=None) -> Path:
    """A run directory as training leaves it: config.json (+ run record), metrics, checkpoints."""
    (d / "checkpoints").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({**to_dict(cfg), "run": {"overrides": overrides or []}}))
    if metrics:
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "train/loss": 1.0}) + "\n" for s in steps))
    for s in steps:
        p = d / "checkpoints" / f"step_{s:07d}.pt"
        p.write_bytes(b"weights of step %d" % s)
        if mtime is not None:
            os.utime(p, (mtime, mtime))
    return d


def test_a_fresh_run_never_reuses_a_directory_and_overwrite_moves_the_old_run_aside(tmp_path):
    run = make_run(tmp_path / "run", cfg_of())
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError) as e:
        plan_run(cfg_of(), run)
    msg = str(e.value)
    assert "\n" not in msg and str(run) in msg
    for option in ("train.resume=auto", "hydra.run.dir=", "train.overwrite=true", "nothing is deleted"):
        assert option in msg
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # untouched

    plan = plan_run(cfg_of(overwrite=True), run)
    assert plan.run_dir == run and plan.checkpoint is None
    aside = [p for p in run.iterdir() if p.name.startswith("replaced_")]
    assert len(aside) == 1 and not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()
    assert {p.relative_to(aside[0]): p.read_bytes() for p in aside[0].rglob("*") if p.is_file()} == before
    assert plan_run(cfg_of(), tmp_path / "new").run_dir == tmp_path / "new"  # an unused directory is fine


def test_resume_auto_resumes_only_the_newest_sibling_run_of_the_same_config(tmp_path, caplog):
    runs = tmp_path / "runs"
    older = make_run(runs / "a", resolved(cfg_of(max_steps=20)), mtime=1000)
    newer = make_run(runs / "b", resolved(cfg_of(max_steps=20, log_interval=5)), mtime=2000)  # an exempt field differs
    other = make_run(runs / "c", cfg_of(max_steps=20, n_experts=4), mtime=3000)  # another config, newest
    make_run(runs / "d", cfg_of(max_steps=20), mtime=4000, metrics=False)  # e.g. an imported HF model: no metrics
    me = runs / "new"
    caplog.set_level(logging.INFO, logger="moe")
    plan = plan_run(cfg_of(max_steps=20, resume="auto"), me)
    assert plan.run_dir == newer and plan.checkpoint == newer / "checkpoints" / "step_0000004.pt"
    assert f"not resuming {other}: another config (model.n_experts: checkpoint has 4, config has 8)" in caplog.text
    assert older.exists() and not me.exists()
    # An intended change admits the other config's run, the newest.
    assert plan_run(cfg_of(max_steps=20, resume="auto", resume_allow=["model.n_experts"]), me).run_dir == other
    # No run of this config anywhere: a fresh start in the requested directory, said in the log.
    caplog.clear()
    plan = plan_run(cfg_of(max_steps=20, resume="auto", top_k=1), me)
    assert plan.run_dir == me and plan.checkpoint is None
    assert "no checkpoint of this run (same config)" in caplog.text and "starting from scratch" in caplog.text


def test_resume_auto_prefers_its_own_directory_and_a_mismatch_there_is_an_error_later(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs / "sibling", cfg_of(), steps=(4, 8), mtime=5000)
    own = make_run(runs / "own", cfg_of(n_experts=4), mtime=1000)
    plan = plan_run(cfg_of(resume="auto"), own)
    assert plan.run_dir == own and plan.checkpoint.name == "step_0000004.pt"  # checked once the state is read


def test_resume_auto_in_a_sweep_resumes_the_job_with_the_same_overrides_only(tmp_path):
    sweep = tmp_path / "multirun"
    base = ["data=text", "train.max_steps=20"]
    # Jobs 0 and 1 differ only in an interval (exempt from the config check): still different jobs.
    make_run(sweep / "0", cfg_of(log_interval=1), overrides=[*base, "train.log_interval=1"], mtime=1000)
    make_run(sweep / "1", cfg_of(log_interval=2), overrides=[*base, "train.log_interval=2"], mtime=2000)
    make_run(sweep / "2", cfg_of(top_k=1), overrides=[*base, "router.top_k=1"], mtime=3000)
    job = lambda *o: JobInfo(overrides=[*base, *o, "train.resume=auto"], sweep=True)  # noqa: E731
    # Same job numbers: each job resumes its own directory.
    assert plan_run(cfg_of(log_interval=1, resume="auto"), sweep / "0", job("train.log_interval=1")).run_dir \
        == sweep / "0"
    # The sweep re-run in another order: the job with router.top_k=1 is now job 0, and resumes job 2's run.
    plan = plan_run(cfg_of(top_k=1, resume="auto"), sweep / "0", job("router.top_k=1"))
    assert plan.run_dir == sweep / "2"
    # Job 1 (log_interval=2) never takes job 0's run, although their configs match but for the interval.
    assert plan_run(cfg_of(log_interval=2, resume="auto"), sweep / "1", job("train.log_interval=2")).run_dir \
        == sweep / "1"
    # A job no earlier sweep ran starts fresh in its own (unused) directory.
    plan = plan_run(cfg_of(top_k=3, resume="auto"), sweep / "3", job("router.top_k=3"))
    assert plan.run_dir == sweep / "3" and plan.checkpoint is None


def test_resume_path_continues_the_newest_checkpoint_and_branches_from_an_older_one(tmp_path):
    run = make_run(tmp_path / "run", cfg_of(), steps=(4, 8))
    plan = plan_run(cfg_of(resume=str(run)), tmp_path / "elsewhere")
    assert plan.run_dir == run and plan.checkpoint.name == "step_0000008.pt" and plan.parent is None
    old = run / "checkpoints" / "step_0000004.pt"
    with pytest.raises(ConfigError, match="older checkpoint of this run directory.*hydra.run.dir"):
        plan_run(cfg_of(resume=str(old)), run)
    plan = plan_run(cfg_of(resume=str(old)), tmp_path / "branch")
    assert (plan.run_dir, plan.checkpoint, plan.parent) == (tmp_path / "branch", old, old)
    # The branch's metrics start with the parent's history up to the branch point.
    assert [json.loads(ln)["step"] for ln in (tmp_path / "branch" / "metrics.jsonl").read_text().splitlines()] == [4]
    write_run_config(cfg_of(resume=str(old)), plan, JobInfo(["train.resume=x"]), 4, [])
    info = json.loads((tmp_path / "branch" / "config.json").read_text())["run"]
    assert info["parent_checkpoint"] == str(old) and info["resumes"][0]["step"] == 4
    assert [p.name for p in (run / "checkpoints").iterdir()] and (run / "metrics.jsonl").read_text().count("\n") == 2
    with pytest.raises(CheckpointError, match="does not exist"):
        plan_run(cfg_of(resume=str(tmp_path / "nope.pt")), tmp_path / "x")


def test_a_crash_before_the_first_checkpoint_restarts_and_stale_temp_files_go(tmp_path, caplog):
    run = make_run(tmp_path / "run", cfg_of(), steps=())
    (run / "metrics.jsonl").write_text('{"step": 0, "val/loss": 5.0}\n')
    plan = plan_run(cfg_of(resume="auto"), run)
    assert plan.run_dir == run and plan.checkpoint is None and not (run / "metrics.jsonl").exists()
    assert [p.name for p in run.glob("replaced_*/metrics.jsonl")] == ["metrics.jsonl"]
    # A save the crash interrupted left its temp file: never a checkpoint, removed on the next start.
    run2 = make_run(tmp_path / "run2", cfg_of(), steps=(4,))
    tmp = run2 / "checkpoints" / "step_0000008.pt.abc123.tmp"
    tmp.write_bytes(b"half")
    caplog.set_level(logging.WARNING, logger="moe")
    assert plan_run(cfg_of(resume="auto"), run2).checkpoint.name == "step_0000004.pt"
    assert not tmp.exists() and "a crash interrupted" in caplog.text


def test_a_resumed_run_moves_the_console_log_and_leaves_no_empty_directory(tmp_path):
    resumed, new = tmp_path / "runs" / "first", tmp_path / "runs" / "second"
    resumed.mkdir(parents=True)
    (resumed / "train.log").write_text("first part\n")
    (new / ".hydra").mkdir(parents=True)  # what Hydra writes before the job starts
    handler = logging.FileHandler(new / "train.log")
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        start = log_offsets(new)
        root.warning("written before the resume was decided")
        follow_into(new, resumed, start)
        root.warning("written after")
        handler.flush()
    finally:
        root.removeHandler(handler)
        handler.close()
    assert not new.exists()
    assert (resumed / "train.log").read_text() == \
        "first part\nwritten before the resume was decided\nwritten after\n"


def test_a_sweep_job_resuming_another_directory_leaves_that_directory_s_log_as_it_was(tmp_path):
    """A re-run sweep in another order: job 0's directory holds another job's run and log."""
    mine, other = tmp_path / "sweep" / "1", tmp_path / "sweep" / "0"
    mine.mkdir(parents=True)
    (mine / "train.log").write_text("job 1 of the first sweep\n")
    make_run(other, cfg_of())
    (other / "train.log").write_text("job 0 of the first sweep\n")
    handler = logging.FileHandler(other / "train.log")  # Hydra opens the job directory's log
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        start = log_offsets(other)
        root.warning("this job")
        follow_into(other, mine, start)
        root.warning("this job, later")
        handler.flush()
    finally:
        root.removeHandler(handler)
        handler.close()
    assert (other / "train.log").read_text() == "job 0 of the first sweep\n"
    assert (mine / "train.log").read_text() == "job 1 of the first sweep\nthis job\nthis job, later\n"
    assert (other / "config.json").exists()  # a directory holding a run is never removed
