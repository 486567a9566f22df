"""`StepProfiler` on a toy loop: windows as torch.profiler's schedule says, the files each
writes, the stage totals counted only inside a step, a loop ending inside a window."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from moe.profiling import ProfileWindow, StepProfiler, stage


def toy_step(model, x):
    with stage("forward"):
        with stage("attention"):
            y = model(x)
        loss = y.square().mean()
    with stage("backward"):
        loss.backward()
    with stage("attention"):  # outside a step's forward (as a validation is): not a stage's time
        model(x)


def run(tmp_path, window, steps, **kw):
    model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    seen = []
    with StepProfiler(tmp_path, window, torch.device("cpu"), on_window=seen.append, **kw) as prof:
        for _ in range(steps):
            toy_step(model, x)
            prof.step()
    return prof, seen


def test_windows_follow_the_schedule_and_are_written(tmp_path):
    prof, seen = run(tmp_path, ProfileWindow(wait=1, warmup=1, active=2, repeat=2), steps=10, first_step=100)
    assert [r.steps for r in seen] == [(103, 104), (107, 108)]  # numbered after first_step
    assert sorted(p.name for p in tmp_path.glob("*.trace.json")) == ["rank0_steps103-104.trace.json",
                                                                      "rank0_steps107-108.trace.json"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [w["steps"] for w in summary["windows"]] == [[103, 104], [107, 108]]
    stages = summary["windows"][0]["stages"]
    assert stages["forward"]["calls"] == stages["attention"]["calls"] == stages["backward"]["calls"] == 2
    assert prof.prof is None  # both windows written: stopped


def test_a_loop_that_ends_inside_a_window_writes_it_shorter(tmp_path):
    _, seen = run(tmp_path, ProfileWindow(wait=0, warmup=1, active=5, repeat=1), steps=3, name="engine",
                  summary_file="s.json", memory=False)
    assert [r.steps for r in seen] == [(2, 3)]
    assert seen[0].memory is None and not list(tmp_path.glob("*.memory.*"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine_steps2-3.trace.json", "s.json"]


def test_a_loop_that_ends_before_a_window_writes_nothing_but_the_folder(tmp_path):
    _, seen = run(tmp_path, ProfileWindow(wait=3, warmup=1, active=1, repeat=1), steps=2)
    assert seen == [] and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the allocator snapshot and kernel times need CUDA")
def test_on_cuda_a_window_writes_the_allocator_snapshot_and_device_times(tmp_path):
    model, x = torch.nn.Linear(256, 256).cuda(), torch.randn(64, 256, device="cuda")
    with StepProfiler(tmp_path, ProfileWindow(wait=0, warmup=1, active=2), torch.device("cuda")) as prof:
        for _ in range(3):
            toy_step(model, x)
            prof.step()
    window, = json.loads((tmp_path / "summary.json").read_text())["windows"]
    assert window["memory"] == "rank0_steps2-3.memory.pickle"
    with open(tmp_path / window["memory"], "rb") as f:
        snapshot = pickle.load(f)
    assert snapshot["segments"] and snapshot["device_traces"]  # what pytorch.org/memory_viz reads
    assert window["stages"]["forward"]["device_ms"] > 0 and window["top_ops"][0]["self_device_ms"] > 0
    assert not prof.history_on  # the allocator history stops with the window
