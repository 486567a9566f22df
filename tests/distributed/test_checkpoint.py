"""Resume across world sizes: a run checkpointed by 1 process continues on 2 (fsdp, from the
single-file checkpoint) and a run checkpointed by 2 (ep, DCP shards) continues on 1; both
log what the uninterrupted single-process run logs (within the fp32 tolerance of
test_parallel.py), and keep their data position (the global batch index), RNG and
logging window. A DCP checkpoint also resumes in another layout at the same world size
(ep -> ep + fsdp: experts from 2 EP shards, dense weights into FSDP shards)."""

from __future__ import annotations

import pytest
import torch

from moe.checkpoint import list_checkpoints
from moe.loading import load_model
from tests.distributed.dist_helpers import STEPS
from tests.distributed.test_parallel import assert_same_run


@pytest.mark.slow
def test_one_process_checkpoint_resumes_on_two(dist_runs):
    run = dist_runs["from_single"]
    assert_same_run(dist_runs["ref"], run, steps=range(6, STEPS + 1), loads=False)
    # the resumed steps wrote a DCP checkpoint beside the single-file one
    assert [p.name for p in list_checkpoints(run)] == ["step_0000005.pt", "step_0000010"]


@pytest.mark.slow
def test_two_process_checkpoint_resumes_on_one(dist_runs):
    run = dist_runs["from_two"]
    assert_same_run(dist_runs["ref"], run, steps=range(6, STEPS + 1), loads=False)
    assert [p.name for p in list_checkpoints(run)] == ["step_0000005", "step_0000010.pt"]
    a, b = load_model(dist_runs["ref"])[0].state_dict(), load_model(run)[0].state_dict()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_dcp_checkpoint_resumes_in_another_layout(dist_runs):
    run = dist_runs["resharded"]
    assert_same_run(dist_runs["ref"], run, steps=range(6, STEPS + 1), loads=False)
    assert [p.name for p in list_checkpoints(run)] == ["step_0000005", "step_0000010"]


def test_dcp_model_only_read_leaves_the_optimizer_unread(tmp_path):
    """`read_dcp_checkpoint(model_only=True)` (what `load_model` uses) asks DCP for the model's
    tensors only: the optimizer's are never allocated or read."""
    import torch.distributed.checkpoint as dcp

    from moe.distributed.checkpoint import _load_whole
    model = {"w": torch.randn(4, 3), "b": torch.randn(3)}
    dcp.save({"model": model, "optim": {"w.exp_avg": torch.randn(4, 3)}}, checkpoint_id=str(tmp_path), no_dist=True)
    full, only = _load_whole(tmp_path), _load_whole(tmp_path, {"model"})
    assert set(full) == {"model", "optim"} and set(only) == {"model"}
    assert all(torch.equal(only["model"][k], v) for k, v in model.items())
