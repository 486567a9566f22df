"""`train.profile.enabled=true`: a tiny CPU run writes a Chrome trace with the model's named
ranges, a memory record and the per-stage summary; a window past max_steps is one line, nothing written."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from moe.config import load_config
from moe.errors import ConfigError
from moe.profiling import STAGES
from moe.train import train
from tests.conftest import REPO
from tests.train.runs import composed_cfg, run_args

PROFILE = ["train.max_steps=6", "train.profile.enabled=true", "train.profile.wait=1", "train.profile.warmup=1",
           "train.profile.active=2", "train.profile.top_ops=8"]


def trace_names(path) -> set[str]:
    return {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("profiled")
    run = tmp / "run"
    train(composed_cfg(tmp / "cache", *PROFILE), run)
    return run


def test_a_profiled_run_writes_a_trace_with_the_named_ranges(profiled_run):
    profile = profiled_run / "profile"
    # wait 1 + warmup 1: steps 3 and 4 are recorded (step 4 also validates: validation is not a stage's time)
    assert sorted(p.name for p in profile.iterdir()) == ["rank0_steps3-4.memory.json", "rank0_steps3-4.trace.json",
                                                         "summary.json"]
    names = trace_names(profile / "rank0_steps3-4.trace.json")
    assert {"forward", "backward", "optimizer", "attention", "routing", "dispatch", "expert_gemm"} <= names
    assert {"ProfilerStep#2", "ProfilerStep#3"} <= names  # torch counts steps from 0: the run's steps 3 and 4


def test_the_summary_holds_the_stage_times_and_top_operators(profiled_run):
    window, = json.loads((profiled_run / "profile" / "summary.json").read_text())["windows"]
    assert window["steps"] == [3, 4] and window["rank"] == 0 and window["device"] == "cpu"
    stages = window["stages"]
    assert set(stages) == set(STAGES) - {"all_to_all"}  # one process: no expert-parallel exchange
    # 2 steps x 2 layers: the validation and routing probe of step 4 run the model outside a step's forward
    assert stages["attention"]["calls"] == stages["routing"]["calls"] == stages["expert_gemm"]["calls"] == 4
    assert stages["forward"]["calls"] == stages["backward"]["calls"] == stages["optimizer"]["calls"] == 2
    assert 0 < stages["attention"]["cpu_ms"] < stages["forward"]["cpu_ms"]
    assert stages["forward"]["cpu_ms_per_step"] == pytest.approx(stages["forward"]["cpu_ms"] / 2, abs=1e-3)
    ops = window["top_ops"]
    assert len(ops) == 8 and all(op["name"] not in STAGES and not op["name"].startswith("ProfilerStep") for op in ops)
    assert [op["self_cpu_ms"] for op in ops] == sorted((op["self_cpu_ms"] for op in ops), reverse=True)
    memory = json.loads((profiled_run / "profile" / window["memory"]).read_text())
    assert memory["operators"] and all("self_cpu_mb" in op for op in memory["operators"])


def test_the_stage_times_reach_metrics_jsonl(profiled_run):
    records = [json.loads(line) for line in (profiled_run / "metrics.jsonl").read_text().splitlines()]
    profiled = [r for r in records if "profile/forward_cpu_ms" in r]
    assert [r["step"] for r in profiled] == [4]
    assert profiled[0]["profile/attention_cpu_ms"] > 0


def test_the_console_shows_the_stages_and_top_operators(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="moe"):
        train(composed_cfg(tmp_path / "cache", *PROFILE, "train.max_steps=4", "train.eval_interval=100",
                           "train.profile.wait=0", "train.profile.warmup=1", "train.profile.active=1",
                           "train.profile.repeat=0"), tmp_path / "run")
    text = caplog.text
    # repeat=0: a window every 2 steps until the end
    assert "profile of steps 2-2 (rank 0)" in text and "profile of steps 4-4 (rank 0)" in text
    assert "| expert_gemm |" in text and "| operator |" in text
    assert sorted(p.name for p in (tmp_path / "run" / "profile").glob("*.trace.json")) == [
        "rank0_steps2-2.trace.json", "rank0_steps4-4.trace.json"]


@pytest.mark.parametrize("overrides, message", [
    (["train.profile.wait=5", "train.profile.active=5"],
     "train.profile: the window (wait=5 + warmup=1 + active=5) ends at step 11, past train.max_steps=10"),
    (["train.profile.repeat=2", "train.profile.wait=3"],
     "train.profile: the window (wait=3 + warmup=1 + active=3 x train.profile.repeat=2) ends at step 14"),
    (["train.profile.wait=-1"], "train.profile.wait=-1 must be >= 0"),
    (["train.profile.active=0"], "train.profile.active=0 must be > 0"),
])
def test_a_bad_profile_window_is_one_config_error(overrides, message):
    raw = {"train": {"max_steps": 10, "profile": {"enabled": True}}, "logger": {"name": "none"}}
    for o in overrides:
        key, value = o.removeprefix("train.profile.").split("=")
        raw["train"]["profile"][key] = int(value)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        load_config(raw)


def test_a_window_past_max_steps_is_refused_before_anything_is_written(tmp_path):
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "train.py", *run_args(tmp_path / "cache", "train.max_steps=4",
                                                              "train.profile.enabled=true"), f"hydra.run.dir={run}"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "error: train.profile: the window (wait=5 + warmup=1 + active=3) ends at step 9, past train.max_steps=4; "
        "lower train.profile.wait / warmup / active / repeat or raise train.max_steps"]
    assert not run.exists() and not (tmp_path / "cache").exists()


@pytest.mark.slow
def test_expert_parallel_ranks_each_write_a_trace_with_the_all_to_alls(tmp_path):
    from moe.data import prepare_data
    from tests.distributed.dist_helpers import MODES, raw_cfg, run_jobs

    profile = dict(enabled=True, wait=1, warmup=1, active=2)
    raw = raw_cfg(tmp_path, distributed=MODES["ep"], train=dict(max_steps=4, eval_interval=4, profile=profile))
    prepare_data(load_config(raw).data)  # a distributed run only reads prepared data
    run_jobs([{"cfg": raw, "run_dir": str(tmp_path / "run")}], tmp_path)
    out = tmp_path / "run" / "profile"
    assert sorted(p.name for p in out.glob("*.json")) == [
        "rank0_steps3-4.memory.json", "rank0_steps3-4.trace.json", "rank1_steps3-4.memory.json",
        "rank1_steps3-4.trace.json", "summary.json", "summary_rank1.json"]
    for rank in (0, 1):
        names = trace_names(out / f"rank{rank}_steps3-4.trace.json")
        assert {"forward", "backward", "routing", "dispatch", "expert_gemm", "all_to_all"} <= names
    stages = json.loads((out / "summary_rank1.json").read_text())["windows"][0]["stages"]
    # per step and layer: the count exchange, dispatch and combine, and the two exchanges of the backward
    assert stages["all_to_all"]["calls"] == 2 * 2 * 5
