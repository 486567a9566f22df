"""Reductions over ranks: logged numbers, routing records, gradients DDP/FSDP do not own,
and the gradient norm of sharded parameters.

Metrics: every rank's step loss and routing record are combined each micro-batch/step (one
small all-reduce each), so the logged expert load is the global load, the loss the mean
over the global batch, and every rank holds the same logging window (which therefore
resumes at any world size).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from moe.routing.metrics import MoERecord
from moe.routing.routers import Router


def mean_over_ranks(values, device: torch.device) -> list[float]:
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t / dist.get_world_size()).tolist()


@torch.no_grad()
def reduce_records(records: list[MoERecord], world_size: int, device: torch.device) -> list[MoERecord]:
    """Sum counts, entropies, token and drop counts over ranks; average aux/z losses."""
    parts = []
    for r in records:
        parts += [r.counts_E.double(), r.selected_E.double(), r.entropy_sum.double().reshape(1),
                  torch.tensor([float(r.n_tokens)], dtype=torch.float64, device=r.counts_E.device),
                  r.n_dropped.double().reshape(1), r.aux_loss.double().reshape(1), r.z_loss.double().reshape(1)]
    flat = torch.cat([p.to(device) for p in parts])
    dist.all_reduce(flat)
    out, i = [], 0
    for r in records:
        E = r.counts_E.numel()

        def take(n):
            nonlocal i
            v = flat[i:i + n]
            i += n
            return v
        counts, selected, ent, n_tok, dropped, aux, z = (take(E), take(E), take(1), take(1), take(1), take(1),
                                                         take(1))
        out.append(MoERecord(counts.round().long(), selected.round().long(), ent[0], int(round(float(n_tok[0]))),
                             dropped[0].round().long(), aux[0] / world_size, z[0] / world_size))
    return out


def grad_buckets(grads: list[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Consecutive runs of `grads` (indices) of one dtype and device, each at most `bucket_bytes`
    (a gradient bigger than that is a bucket of its own). `bucket_bytes <= 0`: one bucket per
    dtype/device run, i.e. everything in one buffer."""
    buckets: list[list[int]] = []
    size = 0
    for i, g in enumerate(grads):
        nbytes = g.numel() * g.element_size()
        prev = grads[buckets[-1][-1]] if buckets else None
        same_kind = prev is not None and (prev.dtype, prev.device) == (g.dtype, g.device)
        if same_kind and (bucket_bytes <= 0 or size + nbytes <= bucket_bytes):
            buckets[-1].append(i)
            size += nbytes
        else:
            buckets.append([i])
            size = nbytes
    return buckets


@torch.no_grad()
def all_reduce_bucketed(grads: list[torch.Tensor], bucket_bytes: int, group=None) -> None:
    """Sum `grads` in place over `group`, a bucket at a time: one flat buffer of at most
    `bucket_bytes` at once instead of a copy of all of them (at Mixtral size a rank's local
    expert gradients are GBs). A bucket of one contiguous gradient is reduced in place."""
    for idx in grad_buckets(grads, bucket_bytes):
        bucket = [grads[i] for i in idx]
        if len(bucket) == 1 and bucket[0].is_contiguous():
            dist.all_reduce(bucket[0], group=group)
            continue
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, group=group)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


@torch.no_grad()
def reduce_expert_grads(par, bucket_bytes: int = 0) -> None:
    """EP expert gradients: each rank's local experts hold the sum over its EP group of the
    per-rank loss gradients; sum over the replicas of the same experts (the `edp` group) and
    divide by the world size, which is what DDP/FSDP's averaging does to the dense weights.
    The sum goes in buckets of `bucket_bytes` (`distributed.ep_grad_bucket_mb`; <= 0: one buffer)."""
    params = [p for _, p in par.expert_params if p.requires_grad]
    if not params:
        return
    for p in params:
        if p.grad is None:  # no token reached these experts on this rank: a zero gradient
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    dims = par.dims
    if dims.world_size // dims.ep_size > 1:
        all_reduce_bucketed(grads, bucket_bytes, group=par.edp_group)
    torch._foreach_div_(grads, float(dims.world_size))


@torch.no_grad()
def reduce_router_counts(model: nn.Module, dims) -> None:
    """Sum non-gradient routing statistics (aux_free's `load_counts`) over all data-parallel
    ranks, so `after_step` makes the same bias update everywhere, from the global load."""
    counts = [m.load_counts for m in model.modules() if isinstance(m, Router) and hasattr(m, "load_counts")]
    if not counts or dims.world_size == 1:
        return
    flat = torch.cat([c.reshape(-1).float() for c in counts])
    dist.all_reduce(flat)
    offset = 0
    for c in counts:
        c.copy_(flat[offset:offset + c.numel()].view_as(c))
        offset += c.numel()


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def clip_grad_norm_(model: nn.Module, max_norm: float, par) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` for a mix of FSDP-sharded (DTensor), EP-sharded and
    replicated gradients: squared norms of shards are summed over the ranks that split them."""
    from torch.distributed.tensor import DTensor
    expert_ids = {id(p) for _, p in par.expert_params}
    dims = par.dims
    sharded, ep_local, replicated = [], [], []
    for p in model.parameters():
        if p.grad is None:
            continue
        if id(p) in expert_ids:
            ep_local.append(p.grad)
        elif isinstance(p.grad, DTensor):
            sharded.append(p.grad.to_local())
        else:
            replicated.append(p.grad)

    def sq(ts):
        if not ts:
            return torch.zeros((), dtype=torch.float32, device=dims.device)
        return torch.stack([torch.linalg.vector_norm(t, dtype=torch.float32) for t in ts]).pow(2).sum()

    parts = torch.stack([sq(sharded), sq(ep_local), sq(replicated)])
    if par.fsdp_root is not None:  # FSDP shards every DTensor over all ranks
        s = parts[0].clone()
        dist.all_reduce(s)
        parts[0] = s
    if dims.ep_size > 1:
        e = parts[1].clone()
        dist.all_reduce(e, group=par.ep_group)
        parts[1] = e
    total = parts.sum().sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    grads = [_local(p.grad) for p in model.parameters() if p.grad is not None]
    torch._foreach_mul_(grads, coef.to(grads[0].device) if grads else coef)
    return total
