"""Checkpoints of distributed runs with torch.distributed.checkpoint (DCP).

A distributed checkpoint is a directory `<run_dir>/checkpoints/step_XXXXXXX/`:

    .metadata, __<rank>_0.distcp   model and AdamW state, each rank writing its own shards
    meta.pt                        everything else a resume needs (step, data position, every
                                   rank's RNG state, config, tokenizer, logging window, W&B id)

It is written into a hidden temp directory beside it, which rank 0 renames into place once
every rank has finished (`.metadata` last, then `meta.pt`, fsynced): a crash leaves the old
set of checkpoints and a stray `.step_*.tmp-*` directory, never a half checkpoint under a
checkpoint's name.

Tensors are stored under their global shapes, whatever the layout that saved them: FSDP2
shards are DTensors, and the local slices of expert-parallel weights (and their AdamW
moments) are saved as DTensors on the (edp, ep) mesh. So a checkpoint loads into any layout
and world size (DCP reshards on load), into a single process (`read_dcp_checkpoint`, used by
`moe.checkpoint.read_checkpoint` and so by `load_model` and `distributed=none` resumes), and
the single-file checkpoints of `distributed=none` load into any distributed layout
(`load_train_state`). The optimizer state is keyed by parameter name, not by position.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from moe.checkpoint import DCP_META_FILE, FORMAT_VERSION, checkpoint_dir, is_dcp_checkpoint, load_checked, read_checkpoint
from moe.errors import CheckpointError


# ---------------------------------------------------------------------------------- state


@torch.no_grad()
def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create AdamW's state (zeros) if no step was taken yet, without changing any weight:
    one step with zero gradients at lr 0 (what torch.distributed.checkpoint.state_dict does)."""
    if optimizer.state:
        return
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    saved_grads = [p.grad for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    lrs = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = 0.0
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, lrs):
        g["lr"] = lr
    for p, grad in zip(params, saved_grads):
        p.grad = grad


def _expert_dtensor(t: torch.Tensor, par):
    """This rank's slice of an expert tensor, viewed as the global tensor it is part of."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    return DTensor.from_local(t.detach(), par.ep_mesh, [Replicate(), Shard(0)], run_check=False)


def train_state_template(model: nn.Module, optimizer: torch.optim.Optimizer, par) -> dict:
    """{"model": state dict, "optim": {param name: AdamW state}} of live tensors (no copies):
    DCP saves from them and loads into them in place. `par`: what `parallelize` built."""
    init_optimizer_state(optimizer)
    expert_ids = {id(p) for _, p in par.expert_params}
    model_sd = model.state_dict()
    for name, p in par.expert_params:
        model_sd[name] = _expert_dtensor(p, par)
    names = {id(p): n for n, p in model.named_parameters()}
    optim = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state.get(p, {})
            optim[names[id(p)]] = {k: _expert_dtensor(v, par) if id(p) in expert_ids and torch.is_tensor(v)
                                   and v.dim() > 0 else v for k, v in st.items()}
    return {"model": model_sd, "optim": optim}


def named_optimizer_state(optimizer_sd: dict, ordered: list[str]) -> dict:
    """A `distributed=none` optimizer state dict (state keyed by position) -> keyed by name.
    `ordered`: the parameter names in the order a single-process optimizer holds them (the
    trainer's `moe.train.optim.param_names_in_order`)."""
    ids = [i for g in optimizer_sd["param_groups"] for i in g["params"]]
    if len(ids) != len(ordered):
        raise CheckpointError(f"the checkpoint's optimizer has {len(ids)} parameters, the model {len(ordered)}")
    return {name: optimizer_sd["state"][i] for i, name in zip(ids, ordered) if i in optimizer_sd["state"]}


def load_named_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, named: dict) -> None:
    """Load name-keyed AdamW state into a plain (single-process) optimizer."""
    names = {id(p): n for n, p in model.named_parameters()}
    sd = optimizer.state_dict()
    state, i = {}, 0
    for g in optimizer.param_groups:
        for p in g["params"]:
            n = names[id(p)]
            if n not in named:
                raise CheckpointError(f"the checkpoint has no optimizer state for {n!r}")
            state[i] = named[n]
            i += 1
    optimizer.load_state_dict({"state": state, "param_groups": sd["param_groups"]})


@torch.no_grad()
def _copy_full(target, source, key: str = "") -> None:
    """Copy full (unsharded) tensors into the live, possibly sharded, tensors of `target`."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    if isinstance(target, dict):
        for k, t in target.items():
            if k not in source:
                raise CheckpointError(f"the checkpoint has no entry {key + str(k)!r}")
            _copy_full(t, source[k], f"{key}{k}.")
        return
    if not torch.is_tensor(target):
        return
    src = torch.as_tensor(source)
    if key.endswith("router.table.") and tuple(src.shape) != tuple(target.shape):
        return  # hash routing table: a pure function of the token id, only its length can differ
    if tuple(src.shape) != tuple(target.shape):
        raise CheckpointError(f"{key[:-1]!r}: the checkpoint has shape {tuple(src.shape)}, "
                              f"the model {tuple(target.shape)}")
    if isinstance(target, DTensor):
        src = distribute_tensor(src.to(target.device, target.dtype), target.device_mesh, target.placements,
                                src_data_rank=None).to_local()
        target.to_local().copy_(src)
    else:
        target.copy_(src)


# ---------------------------------------------------------------------------------- save


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_train_state(run_dir: Path, step: int, model: nn.Module, optimizer, extra: dict, par) -> Path:
    """Write `checkpoints/step_XXXXXXX/` (all ranks call this together)."""
    import torch.distributed.checkpoint as dcp

    dims = par.dims
    final = checkpoint_dir(run_dir) / f"step_{step:07d}"
    tmp = dims.on_main(lambda: final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
    if dims.is_main:
        tmp.mkdir(parents=True)
    dims.barrier()
    dcp.save(train_state_template(model, optimizer, par), checkpoint_id=str(tmp))
    rngs = [None] * dims.world_size
    dist.all_gather_object(rngs, extra["rng"])
    if dims.is_main:
        meta = {"format_version": FORMAT_VERSION, **extra, "rng_per_rank": rngs, "world_size": dims.world_size,
                "distributed": dims.mode, "ep_size": dims.ep_size}
        with open(tmp / DCP_META_FILE, "wb") as f:
            torch.save(meta, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if final.exists():  # the same step saved again (a resumed run redoing it)
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    dims.barrier()
    return final


# ---------------------------------------------------------------------------------- load


def _read_meta(path: Path) -> dict:
    return load_checked(path / DCP_META_FILE, path, ("config",))


def _load_whole(path: Path, keys: Optional[set] = None) -> dict:
    """Every tensor of a DCP checkpoint (or those under the top-level `keys`, e.g. {"model"}),
    unsharded, in this process (what `dcp_to_torch_save` does)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    sd: dict = {}
    _load_state_dict(sd, storage_reader=FileSystemReader(str(path)), planner=_EmptyStateDictLoadPlanner(keys),
                     no_dist=True)
    return sd


def read_dcp_checkpoint(path: Path, model_only: bool = False) -> dict:
    """A DCP checkpoint directory as one process's full state: `model` (full tensors),
    `optimizer_by_name` (empty with `model_only`: the optimizer's tensors are not read), and the
    entries of `meta.pt`. Needs no process group."""
    path = Path(path)
    meta = _read_meta(path)
    try:
        sd = _load_whole(path, {"model"} if model_only else None)
    except Exception as e:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt or truncated and cannot be read "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    if "model" not in sd:
        raise CheckpointError(f"{str(path)!r} is not a moe-lab checkpoint (no model entries)")
    return {**meta, "model": sd["model"], "optimizer_by_name": sd.get("optim", {})}


def read_resume_state(path: Path, dims) -> dict:
    """What a distributed rank needs to resume: for a DCP directory only `meta.pt` (the
    tensors are loaded in place, sharded, by `load_train_state`); a single-file checkpoint
    whole. `rng` becomes this rank's own RNG state when the checkpoint has one for it."""
    path = Path(path)
    if is_dcp_checkpoint(path):
        state = {**_read_meta(path), "dcp_path": path}
    else:
        state = read_checkpoint(path)
    per_rank = state.get("rng_per_rank")
    if per_rank:
        state["rng"] = per_rank[dims.rank] if dims.rank < len(per_rank) else per_rank[0]
    return state


def load_train_state(model: nn.Module, optimizer, state: dict, par, param_order: list[str]) -> None:
    """Load weights and AdamW state from any checkpoint into this rank's layout (`par`: what
    `parallelize` built; `param_order`: see `named_optimizer_state`)."""
    if not par.dims.enabled:  # one process, a DCP checkpoint read whole by read_dcp_checkpoint
        model.load_state_dict(state["model"])
        load_named_optimizer_state(model, optimizer, state["optimizer_by_name"])
        return
    template = train_state_template(model, optimizer, par)
    if "dcp_path" in state:
        import torch.distributed.checkpoint as dcp
        try:
            dcp.load(template, checkpoint_id=str(state["dcp_path"]))
        except Exception as e:
            raise CheckpointError(f"checkpoint {str(state['dcp_path'])!r} does not fit this model: "
                                  f"{type(e).__name__}: {str(e)[:500]}") from None
        return
    named = state.get("optimizer_by_name") or named_optimizer_state(state["optimizer"], param_order)
    _copy_full(template, {"model": state["model"], "optim": named})
