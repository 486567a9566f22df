"""Apply a distributed mode to a freshly built (identical on every rank) model.

    ddp    DistributedDataParallel over all ranks.
    fsdp   FSDP2 `fully_shard`: each router, then each transformer block, then the root
           (embedding, final norm, LM head); parameters, gradients and AdamW state are
           sharded over all ranks. On CUDA with train.dtype=bf16 (or mixed_precision=bf16)
           the gathered parameters are bf16 and gradients are reduced in fp32.
    ep     the experts of every MoE layer are split over groups of `ep_size` ranks
           (expert_parallel.py); everything else is data parallel over all ranks, with DDP,
           or with FSDP2 when `distributed.fsdp=true` (the expert weights are then left out
           of FSDP: they are already sharded).

Routers are sharded as FSDP units of their own so that the routing probes (which call a
router directly, outside its block) see gathered weights. Every rank starts from rank 0's
weights (one broadcast), so the run starts exactly where a single-process run would.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import nn

from moe.distributed.balance import attach_global_balance
from moe.distributed.context import DistContext

log = logging.getLogger("moe")


@torch.no_grad()
def broadcast_from_rank0(model: nn.Module) -> None:
    for t in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(t.data, src=0)


def _mp_policy(cfg, device: torch.device):
    from torch.distributed.fsdp import MixedPrecisionPolicy
    mp = cfg.distributed.mixed_precision
    bf16 = mp == "bf16" or (mp == "auto" and device.type == "cuda" and cfg.train.dtype == "bf16")
    if bf16:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def apply_fsdp(model: nn.Module, ctx: DistContext, cfg, ignored: set) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,), mesh_dim_names=("dp",))
    kw = dict(mesh=mesh, mp_policy=_mp_policy(cfg, ctx.device))
    reshard = cfg.distributed.reshard_after_forward
    for block in model.layers:
        if block.is_moe:
            fully_shard(block.ffn.router, reshard_after_forward=reshard, **kw)
        block_ignored = {p for p in block.parameters() if p in ignored}
        fully_shard(block, reshard_after_forward=reshard, ignored_params=block_ignored or None, **kw)
    fully_shard(model, reshard_after_forward=False, ignored_params=ignored or None, **kw)
    ctx.fsdp_root = model


def apply_ddp(model: nn.Module, ctx: DistContext, ignored_names: list) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP
    if ignored_names:  # EP expert weights: sharded, their gradients are reduced by reduce_expert_grads
        DDP._set_params_and_buffers_to_ignore_for_model(model, ignored_names)
    # broadcast_buffers=False: buffers are either identical on every rank or per-rank
    # statistics (aux_free's load counts) that must not be overwritten by rank 0's.
    ddp = DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
              broadcast_buffers=False)
    ctx.ddp = ddp
    return ddp


def parallelize(model: nn.Module, ctx: DistContext, cfg) -> nn.Module:
    d = cfg.distributed
    if ctx.world_size > 1:
        broadcast_from_rank0(model)
        if d.global_balance:
            ctx.balance_group = dist.new_group(ranks=list(range(ctx.world_size)))
            attach_global_balance(model, ctx.balance_group)
    for m in model.modules():
        if hasattr(m, "_ensure_rows"):  # hash routing: a full-vocabulary table, one shape on every rank
            m._ensure_rows(model.cfg.vocab_size - 1)  # (its rows depend only on the token id)
    ignored: set = set()
    ignored_names: list = []
    if ctx.mode == "ep":
        from torch.distributed.device_mesh import init_device_mesh
        from moe.distributed.expert_parallel import shard_experts
        ctx.ep_mesh = init_device_mesh(ctx.device.type, (ctx.world_size // ctx.ep_size, ctx.ep_size),
                                       mesh_dim_names=("edp", "ep"))
        ep_rank = ctx.ep_mesh.get_local_rank("ep")
        ctx.expert_params = shard_experts(model, ep_rank, ctx.ep_size, ctx.ep_group)
        ignored = {p for _, p in ctx.expert_params}
        ignored_names = [n for n, _ in ctx.expert_params]
    if ctx.mode == "fsdp" or (ctx.mode == "ep" and d.fsdp):
        apply_fsdp(model, ctx, cfg, ignored)
        return model
    return apply_ddp(model, ctx, ignored_names)
