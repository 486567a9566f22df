"""Rank 0 builds and initialises the model; every other rank builds it on the meta device and,
once `parallelize` has laid it out, receives only its own shards of rank 0's weights.

Why not every rank building the full model: a 7B MoE in fp32 is 28 GB per rank, 224 GB of host
RAM on a node of 8, and minutes of random init each. Why rank 0 still initialises the whole
model (rather than every rank initialising its shard): the run then starts from exactly the
weights, and the RNG state, of a single-process run with the same seed, which the distributed
parity tests require (tests/distributed/test_parallel.py).

    build_model(factory, dims)     rank 0 (or one process): factory() on the device; others: on meta
    named_tensors(model)           taken before sharding: rank 0's full tensors (the others' shapes)
    fill_from_rank0(model, ...)    after sharding: materialise the meta ranks, scatter each tensor

Every tensor of the model is split along dim 0 only (FSDP2's default `Shard(0)`, expert
parallelism's slice of the expert dimension) or replicated (DDP, buffers), so each rank's part
of a full tensor is one row range. Rank 0 learns every rank's range once, then sends each rank
its rows with one `scatter` per tensor (ranges padded to the longest): a non-zero rank never
holds more of a tensor than its padded part. A tensor every rank holds whole is one `broadcast`. The torch helper that does this for FSDP
(`set_model_state_dict(..., broadcast_from_rank0=True)`) broadcasts each full tensor to every
rank and knows nothing of the expert slices, hence this small version.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from moe.distributed.dims import ParallelDims
from moe.meta import meta_device

Region = tuple[int, int]  # (first row, number of rows) of a full tensor along dim 0


def build_model(factory: Callable[[], nn.Module], dims: ParallelDims) -> nn.Module:
    """`factory()` on rank 0 (and on one process), moved to the run's device; on the other ranks
    under `torch.device("meta")` (no memory, no init), which `fill_from_rank0` later fills. Every
    rank leaves with rank 0's CPU RNG state, as if it had run the same initialisation."""
    if not dims.many or dims.is_main:
        model = factory().to(dims.device)
    else:
        with meta_device():
            model = factory()
    if dims.many:
        torch.set_rng_state(dims.on_main(torch.get_rng_state))
    return model


def is_meta_built(model: nn.Module) -> bool:
    return any(t.is_meta for t in named_tensors(model).values())


def named_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by name (a tied parameter once). Taken before sharding, rank 0's
    are references that keep the full tensors alive until `fill_from_rank0` has sent them."""
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def to_empty_tied(model: nn.Module, device: torch.device) -> None:
    """`model.to_empty(device)` (uninitialised storage; Rotary rebuilds its tables on the move,
    moe.model.Rotary) keeping tied parameters tied: `to_empty` makes a new Parameter per module for a
    plain meta tensor, which would give a tied embedding / LM head two separate tensors."""
    first: dict[int, str] = {}
    ties = []  # (module name, attribute, name of the parameter it shares)
    for module_name, module in model.named_modules():
        for attr, p in module._parameters.items():
            if p is None:
                continue
            name = f"{module_name}.{attr}" if module_name else attr
            if id(p) in first:
                ties.append((module_name, attr, first[id(p)]))
            else:
                first[id(p)] = name
    model.to_empty(device=device)
    for module_name, attr, shared in ties:
        setattr(model.get_submodule(module_name), attr, model.get_parameter(shared))


def _region(local: torch.Tensor, full_shape: torch.Size, expert_offset: int | None) -> Region:
    """The rows of the full tensor that `local` (this rank's tensor after sharding) holds."""
    # Lazy, like FSDP in parallel.py: DTensor is needed only by sharded runs, not every import of moe.distributed.
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    if isinstance(local, DTensor):
        if not all(isinstance(p, (Shard, Replicate)) and (not isinstance(p, Shard) or p.dim == 0)
                   for p in local.placements):
            raise NotImplementedError(f"placements {local.placements}: only Shard(0) / Replicate are filled")
        shape, offset = compute_local_shape_and_global_offset(local.shape, local.device_mesh, local.placements)
        return (int(offset[0]), int(shape[0])) if len(shape) else (0, 1)
    if expert_offset is not None:  # an expert-parallel slice of the expert dimension
        return (expert_offset, int(local.shape[0]))
    if tuple(local.shape) != tuple(full_shape):
        raise RuntimeError(f"a tensor of shape {tuple(local.shape)} for a full {tuple(full_shape)} that is "
                           "neither a DTensor nor an expert slice")
    return (0, int(full_shape[0]) if len(full_shape) else 1)


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor  # lazy: see _region
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def fill_from_rank0(model: nn.Module, full: dict[str, torch.Tensor], dims: ParallelDims,
                    expert_offsets: dict[str, int]) -> None:
    """After sharding: ranks built on meta allocate their (sharded) tensors on the device, then every
    tensor's rows travel from rank 0's `full` to the rank that holds them. `expert_offsets`: the
    first expert of each expert-parallel parameter held here (name -> global expert id)."""
    if is_meta_built(model):
        to_empty_tied(model, dims.device)
    local = named_tensors(model)
    if sorted(local) != sorted(full):
        raise RuntimeError(f"the sharded model's tensors {sorted(set(local) ^ set(full))} differ from the built ones")
    names = sorted(local)
    mine = [_region(local[n], full[n].shape, expert_offsets.get(n)) for n in names]
    everyone: list = [None] * dims.world_size
    dist.all_gather_object(everyone, mine)
    for i, name in enumerate(names):
        dst = _rows(_local(local[name]))
        regions = [everyone[r][i] for r in range(dims.world_size)]
        shape = _rows(full[name]).shape
        if all(r == (0, shape[0]) for r in regions):  # replicated everywhere: one broadcast, no extra buffer
            if dims.is_main and dst.data_ptr() != full[name].data_ptr():
                dst.copy_(_rows(full[name]))
            dist.broadcast(dst, src=0)
            continue
        rows = max(n for _, n in regions)
        recv = torch.empty((rows, *shape[1:]), dtype=full[name].dtype, device=dims.device)
        pieces = None
        if dims.is_main:
            src = _rows(full[name]).to(dims.device)
            pieces = [_padded(src, start, n, rows) for start, n in regions]
        dist.scatter(recv, pieces, src=0)
        dst.copy_(recv[:regions[dims.rank][1]])


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() else t.reshape(1)  # a scalar is one row


def _padded(src: torch.Tensor, start: int, n: int, rows: int) -> torch.Tensor:
    """Rows `start:start+n` of `src`, zero-padded to `rows` (scatter wants equal pieces)."""
    piece = src[start:start + n]
    if n == rows:
        return piece.contiguous()
    out = src.new_zeros((rows, *src.shape[1:]))
    out[:n] = piece
    return out
