"""moe/train/checkpointing.py: the trainer's save / read / load for both layouts, in one process.

A single-file checkpoint and a torch.distributed.checkpoint (DCP) directory must restore the same
weights and AdamW state into a single-process layout and into a distributed one. The distributed
layout here is one rank of `distributed=ddp` with a gloo process group of one (in this process):
the same code path as N ranks (DCP save and in-place load, meta.pt, the rank's RNG), without
spawning workers; tests/distributed/test_checkpoint.py resumes real multi-process runs."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from moe.checkpoint import DCP_META_FILE, checkpoint_path, is_dcp_checkpoint
from moe.distributed import ParallelDims, Parallelized
from moe.train.checkpointing import load_model_optimizer, read_state, save
from moe.train.optim import param_groups
from moe.train.resume import rng_state

SINGLE = Parallelized(dims=ParallelDims(mode="none", device=torch.device("cpu"), local_batch=2, local_accum=1),
                      module=nn.Identity())


def trained(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A model with decayed and non-decayed parameters (their optimizer order differs from
    `model.parameters()`) after two AdamW steps, so every state tensor is non-trivial."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 3), nn.Linear(3, 2, bias=False))
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-2)
    for _ in range(2):
        model(torch.randn(5, 4)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def train_state(model, opt, step: int) -> dict:
    return {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(), "config": {"seed": 1},
            "data": {"batch": 3}, "rng": rng_state(), "log_window": {}}


def assert_same(a: tuple, b: tuple) -> None:
    (ma, oa), (mb, ob) = a, b
    for (k, x), (_, y) in zip(ma.state_dict().items(), mb.state_dict().items()):
        assert torch.equal(x, y), k
    names_a = {id(p): n for n, p in ma.named_parameters()}
    names_b = {id(p): n for n, p in mb.named_parameters()}
    sa = {names_a[id(p)]: s for p, s in oa.state.items()}
    sb = {names_b[id(p)]: s for p, s in ob.state.items()}
    assert sa.keys() == sb.keys() and len(sa) == 5
    for n in sa:
        for k in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(torch.as_tensor(sa[n][k]), torch.as_tensor(sb[n][k])), (n, k)


@pytest.fixture
def one_rank(tmp_path):
    """`distributed=ddp` on a world of one: a gloo group in this process, torn down after."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield ParallelDims(mode="ddp", device=torch.device("cpu"), local_batch=2, local_accum=1, backend="gloo")
    finally:
        dist.destroy_process_group()


def test_single_process_save_and_load_round_trip(tmp_path):
    src = trained(0)
    path = save(tmp_path, 7, *src, train_state(*src, 7), SINGLE)
    assert path == checkpoint_path(tmp_path, 7) and path.is_file()
    state = read_state(path, SINGLE.dims)
    assert state["step"] == 7 and state["data"] == {"batch": 3}
    dst = trained(1)
    load_model_optimizer(*dst, state, SINGLE)
    assert_same(src, dst)


def test_a_dcp_checkpoint_resumes_on_one_process_and_on_a_rank(tmp_path, one_rank):
    src = trained(0)
    par = Parallelized(dims=one_rank, module=src[0])
    saved = train_state(*src, 5)
    path = save(tmp_path, 5, *src, saved, par)
    # a DCP directory (not the single file), with everything but the tensors in meta.pt
    assert is_dcp_checkpoint(path) and path.name == "step_0000005" and (path / DCP_META_FILE).is_file()
    assert not checkpoint_path(tmp_path, 5).exists()
    meta = torch.load(path / DCP_META_FILE, weights_only=True)  # the weights and AdamW state are only in the shards
    assert {"model", "optimizer"}.isdisjoint(meta) and meta["step"] == 5 and meta["data"] == {"batch": 3}
    # one process reads it whole: weights and optimizer state by name
    state = read_state(path, SINGLE.dims)
    assert "optimizer" not in state and state["step"] == 5 and state["world_size"] == 1
    dst = trained(1)
    load_model_optimizer(*dst, state, SINGLE)
    assert_same(src, dst)
    # a rank reads only meta.pt and loads the tensors in place from the shards
    state = read_state(path, one_rank)
    assert state["dcp_path"] == path and "model" not in state
    assert torch.equal(state["rng"]["torch"], saved["rng"]["torch"])  # this rank's RNG, from rng_per_rank
    dst = trained(2)
    load_model_optimizer(*dst, state, Parallelized(dims=one_rank, module=dst[0]))
    assert_same(src, dst)


def test_a_single_file_checkpoint_resumes_on_a_rank(tmp_path, one_rank):
    """The file's optimizer state is keyed by position in the single-process optimizer
    (`param_names_in_order`): a rank maps it to names, so the LayerNorm's state does not land on
    a Linear even though their orders differ."""
    src = trained(0)
    path = save(tmp_path, 3, *src, train_state(*src, 3), SINGLE)
    state = read_state(path, one_rank)
    assert "optimizer" in state
    dst = trained(1)
    load_model_optimizer(*dst, state, Parallelized(dims=one_rank, module=dst[0]))
    assert_same(src, dst)
