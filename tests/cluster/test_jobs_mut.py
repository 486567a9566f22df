"""moe/cluster/jobs.py's helpers on known answers: what the sixth mutation run found untested
(docs/results/mutation/run6_mutX/README.md). No cluster, no torch, no subprocess."""

from __future__ import annotations

import json
import os
import re

import pytest

from moe.cluster.jobs import (MIN_MASTER_PORT, WANDB_TAG_MAX, check_job, export_torch_distributed_env, final_metrics,
                              master_port, override_key, requeue_overrides, sweep_tags, varying_overrides)
from moe.config import load_config
from moe.errors import ConfigError


def test_override_key_strips_hydra_prefixes_and_the_value():
    assert override_key("router.top_k=2") == "router.top_k"
    assert override_key("+x.y=1") == "x.y" and override_key("++x.y=1") == "x.y" and override_key("~x.y") == "x.y"
    assert override_key("a.b=c=d") == "a.b"  # only the first "=" separates the key
    assert override_key("x.y+=1") == "x.y+"  # only leading prefixes are stripped
    assert override_key("+XLA.flag=1") == "XLA.flag" and override_key(" a=1") == " a"  # nothing but "+" and "~"


def test_varying_overrides_keep_only_what_differs_between_jobs():
    jobs = [["router.top_k=1", "seed=0", "name=a=b"], ["router.top_k=2", "seed=0", "name=a=c"]]
    assert varying_overrides(jobs) == [{"router.top_k": "1", "name": "a=b"}, {"router.top_k": "2", "name": "a=c"}]
    # a key set in one job only varies (absent elsewhere); a deletion `~key` has the value "~"
    jobs = [["seed=0", "+extra.x=5"], ["seed=0", "~extra.x"], ["seed=0"]]
    assert varying_overrides(jobs) == [{"extra.x": "5"}, {"extra.x": "~"}, {}]
    # the same value everywhere: nothing varies, every job gets an empty dict
    assert varying_overrides([["a=1", "b=2"], ["b=2", "a=1"]]) == [{}, {}]
    assert varying_overrides([["a=1"]]) == [{}]  # a single job varies in nothing
    assert varying_overrides([]) == []
    # keys come out in sorted order
    out = varying_overrides([["z=1", "a=1"], ["z=2", "a=2"]])
    assert [list(d) for d in out] == [["a", "z"], ["a", "z"]]


def test_sweep_tags_are_sorted_and_cut_to_wandbs_limit():
    assert WANDB_TAG_MAX == 64
    assert sweep_tags({"seed": "1", "router.top_k": "2"}) == ["router.top_k=2", "seed=1"]
    long = {"k": "v" * 100}
    (tag,) = sweep_tags(long)
    assert len(tag) == 64 and tag == ("k=" + "v" * 100)[:64]
    exact = {"k": "v" * 62}  # "k=" + 62 = 64 characters: kept whole
    assert sweep_tags(exact) == ["k=" + "v" * 62]
    assert sweep_tags({}) == []


def test_final_metrics_read_the_summary_and_the_last_training_loss(tmp_path):
    summary = {"step": 300, "initial_val_loss": 5.5, "final_val_loss": 3.25, "train_seconds": 12.5,
               "stopped_early": False, "other": 1}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    lines = [{"step": 1, "train/loss": 6.0}, {"step": 2, "train/loss": 4.5}, {"step": 3, "val/loss": 3.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\nnot json\n")
    assert final_metrics(tmp_path) == {"step": 300, "initial_val_loss": 5.5, "final_val_loss": 3.25,
                                       "train_seconds": 12.5, "stopped_early": False, "train_loss": 4.5}
    assert final_metrics(str(tmp_path))["train_loss"] == 4.5  # a str path works too


def test_final_metrics_of_a_run_with_missing_or_broken_files(tmp_path):
    assert final_metrics(tmp_path) == {}  # neither file
    (tmp_path / "summary.json").write_text("{broken")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"train/loss": 2.0}) + "\n")
    assert final_metrics(tmp_path) == {"train_loss": 2.0}  # an unreadable summary is skipped
    (tmp_path / "summary.json").write_text(json.dumps({"step": 7}))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"val/loss": 2.0}) + "\n")
    assert final_metrics(tmp_path) == {"step": 7}  # no training loss logged
    (tmp_path / "metrics.jsonl").unlink()
    assert final_metrics(tmp_path) == {"step": 7}


def job(nodes=1, gpus=1, tasks=1, distributed="none", batch=32):
    return load_config({"cluster": dict(nodes=nodes, gpus_per_node=gpus, tasks_per_node=tasks),
                        "distributed": dict(name=distributed), "train": dict(batch_size=batch)})


def message(cfg, executor="slurm") -> str:
    with pytest.raises(ConfigError) as e:
        check_job(cfg, executor)
    return str(e.value)


def test_check_job_bounds_and_whole_messages():
    check_job(job(), "slurm")  # one process, no distribution: fine
    check_job(job(), "local")
    check_job(job(gpus=0, tasks=2, distributed="ddp"), "slurm")  # a CPU job (no GPUs) may run 2 tasks
    check_job(job(gpus=2, tasks=2, distributed="ddp"), "slurm")  # one task per GPU
    assert message(job(gpus=1, tasks=2, distributed="ddp")) == (
        "cluster.tasks_per_node=2 > cluster.gpus_per_node=1: training runs one process per GPU; "
        "set cluster.tasks_per_node <= cluster.gpus_per_node")
    assert message(job(nodes=2), "local") == (
        "cluster.nodes=2: hydra/launcher=submitit_local runs every job on this machine; "
        "set cluster.nodes=1 (or use hydra/launcher=submitit_slurm)")
    assert message(job(gpus=2, tasks=2)) == (  # 2 processes, the smallest count that needs distribution
        "cluster.nodes=1 x cluster.tasks_per_node=2 = 2 processes per job but distributed=none (each would "
        "train its own copy); add distributed=ddp, distributed=fsdp or distributed=ep")


def test_a_single_process_job_without_distribution_skips_the_layout_check(monkeypatch):
    import moe.distributed.setup as setup

    seen = []
    monkeypatch.setattr(setup, "check_layout", lambda cfg, world: seen.append((cfg.distributed.name, world)))
    check_job(job(), "slurm")  # distributed=none, one process: nothing to lay out
    assert seen == []
    check_job(job(gpus=2, tasks=2, distributed="ddp"), "slurm")
    assert seen == [("ddp", 2)]


def test_a_requeued_branch_whose_checkpoint_path_holds_an_equals_sign(tmp_path):
    # Hydra names sweep folders `key=value`, so a checkpoint path may hold "=" (even "=auto" or "=null"):
    # the value is everything after the first "=" and it is a path, not the word `auto`.
    for path in ("multirun/resume=auto/checkpoints/step_0000100", "auto=1/checkpoints/step_0000100",
                 "runs/x=null"):
        base = ["router.top_k=2", f"train.resume={path}"]
        assert requeue_overrides(base, tmp_path) == base + ["train.overwrite=true"]


def test_a_requeued_job_started_with_resume_auto_or_null_restarts_with_auto(tmp_path):
    # `null` (no checkpoint given) and `auto` are not checkpoint paths: no branch, no overwrite
    for value in ("null", "auto"):
        assert requeue_overrides(["seed=1", f"train.resume={value}"], tmp_path) == ["seed=1", "train.resume=auto"]
    # a branch's earlier train.overwrite is replaced, not repeated
    base = ["train.overwrite=false", "train.resume=/old/step_0000100", "++train.overwrite=false"]
    assert requeue_overrides(base, tmp_path) == ["train.resume=/old/step_0000100", "train.overwrite=true"]


def test_master_port_range_ends_exactly_below_the_ephemeral_range(tmp_path):
    assert MIN_MASTER_PORT == 20000
    # Ephemeral range from 21001: room for exactly 1000 ports above 20000, so ports are 20000..21000 inclusive.
    # Job ids found (once, by a search over ids) to draw the ends of that range, and one that draws above it
    # from a range two wider: the bounds are exact, whatever other ids draw.
    f = tmp_path / "range"
    f.write_text("21001\t60999\n")
    assert master_port("824", f) == 21000 and master_port("336", f) == 20000
    assert master_port("274", f) <= 21000
    assert all(20000 <= master_port(str(j), f) <= 21000 for j in range(200))
    # from 20999 there is room for 998 only: submitit's whole range 20000..60000 instead
    f.write_text("20999 60999")
    wide = {master_port(str(j), f) for j in range(200)}
    assert min(wide) >= 20000 and max(wide) <= 60000 and max(wide) > 40000
    # an unknown range: submitit's, whose top is 60000 (job "66299" would draw 60001 from a range one wider)
    assert master_port("66299", tmp_path / "missing") <= 60000


SLURM_TASK_1 = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "77", "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "1",
                "SLURM_NODEID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "node01"}


def test_every_task_keeps_every_gpu_of_its_node_visible(monkeypatch):
    monkeypatch.setattr(os, "environ", os.environ.copy())  # nothing leaks into later tests
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        os.environ.pop(k, None)
    os.environ.update({**SLURM_TASK_1, "CUDA_VISIBLE_DEVICES": "0,1"})
    assert export_torch_distributed_env() == {"MASTER_ADDR": "node01", "MASTER_PORT": str(master_port("77")),
                                              "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"  # the trainer picks cuda:LOCAL_RANK among them
