"""moe/checkpoint.py, for the survivors of its mutation re-run (docs/results/mutation/rerun2/README.md).

`fault_pause` with a mutated condition pauses where it should pass through; with the default
`until` (never true) that is a hang, which the mutation driver can only count as "past its time
limit". Here `until` records that the pause was entered and ends it at once, so the same mistake
fails in milliseconds.

`load_checked` reads with `map_location="cpu"`: a checkpoint whose tensors were saved from a GPU
loads onto the CPU, memory-mapped. No GPU is needed to write one: torch records each storage's
device as a tag (`torch.serialization.location_tag`), and the test saves CPU tensors tagged
`cuda:0`. Without the map_location, a CPU-only machine cannot read the tags (the mapped read fails
and the whole-file fallback runs, so nothing is mapped; a legacy file fails outright) and a GPU
machine puts the tensors on the GPU: either way the test fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.serialization

from moe.checkpoint import FORMAT_VERSION, PAUSE_ENV, fault_pause, load_checked
from moe.errors import CheckpointError


def test_fault_pause_passes_through_without_waiting_when_not_asked(monkeypatch, capsys):
    entered = []

    def until():
        entered.append(True)
        return True

    monkeypatch.delenv(PAUSE_ENV, raising=False)
    fault_pause("checkpoint-write", 4, "x", until=until)
    monkeypatch.setenv(PAUSE_ENV, "step-end:4")
    fault_pause("checkpoint-write", 4, "x", until=until)  # another point
    fault_pause("step-end", 5, "x", until=until)  # another step
    assert entered == [] and capsys.readouterr().err == ""
    fault_pause("step-end", 4, "x", until=until)  # its point and step: it waits, and says so
    assert entered == [True]
    assert capsys.readouterr().err == f"{PAUSE_ENV}: paused in step-end of step 4 (x)\n"


def _mapped(path: Path) -> bool:
    target = os.path.realpath(path)
    return any(line.split(maxsplit=5)[5:] == [target] for line in Path("/proc/self/maps").read_text().splitlines())


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_a_checkpoint_of_gpu_tensors_loads_on_the_cpu(tmp_path, monkeypatch, legacy):
    path = tmp_path / "step_0000001.pt"
    weights = torch.arange(4096, dtype=torch.float32)
    with monkeypatch.context() as m:  # as if saved from a GPU: each storage tagged cuda:0
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save({"model": {"w": weights}, "config": {}, "format_version": FORMAT_VERSION}, path,
                   _use_new_zipfile_serialization=not legacy)
    state = load_checked(path, path, ("model", "config"))
    w = state["model"]["w"]
    assert w.device.type == "cpu" and torch.equal(w, weights)
    if not legacy and Path("/proc/self/maps").exists():  # read in place, not read whole
        assert _mapped(path)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_weights_only_is_asked_for_so_an_environment_default_cannot_lift_it(tmp_path, monkeypatch, legacy):
    """torch lets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD turn off weights-only reading where the caller did
    not ask for it; load_checked asks, so a pickled function is still refused (both reads)."""
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "config": {}, "format_version": FORMAT_VERSION, "x": print}, path,
               _use_new_zipfile_serialization=not legacy)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(CheckpointError, match=r"\(UnpicklingError: Weights only load failed"):
        load_checked(path, path, ("model", "config"))
