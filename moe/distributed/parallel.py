"""`parallelize(model, dims, cfg)`: apply a distributed mode to a freshly built model (rank 0's
initialised, the other ranks' on the meta device: `materialize.build_model`) and return what it
built, as a `Parallelized`.

    ddp    DistributedDataParallel over all ranks.
    fsdp   FSDP2 `fully_shard`: each router, then each transformer block, then the root
           (embedding, final norm, LM head); parameters, gradients and AdamW state are
           sharded over all ranks. On CUDA with train.dtype=bf16 (or mixed_precision=bf16)
           the gathered parameters are bf16 and gradients are reduced in fp32.
    ep     the experts of every MoE layer are split over groups of `ep_size` ranks
           (expert_parallel.py replaces each layer's experts module with its local slice);
           everything else is data parallel over all ranks, with DDP, or with FSDP2 when
           `distributed.fsdp=true` (the expert weights are then left out of FSDP: they are
           already sharded).

Routers are sharded as FSDP units of their own so that the routing probes (which call a
router directly, outside its block) see gathered weights. The layout is applied to the meta model
on ranks > 0 (nothing allocated), then each rank materialises and receives only its own rows of
rank 0's weights (`materialize.fill_from_rank0`: its FSDP shards and expert slices, the replicated
rest in full), so the run starts exactly where a single-process run would. The
global balance loss (balance.py) is attached as router forward hooks. Nothing is written into
`dims` or into reserved attributes of the model: what was built is returned.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from moe.distributed.balance import attach_global_balance
from moe.distributed.dims import ParallelDims
from moe.distributed.expert_parallel import ExpertParallelExperts, shard_experts
from moe.distributed.materialize import fill_from_rank0, named_tensors
from moe.distributed.reduce import clip_grad_norm_, reduce_expert_grads, reduce_router_counts
from moe.perf import run_dtype

log = logging.getLogger("moe")


@dataclass
class Parallelized:
    """What `parallelize` built. `module` is what the training loop calls (the DDP wrapper, or
    the model itself); the model keeps its own parameter names for checkpoints either way."""

    dims: ParallelDims
    module: nn.Module
    ddp: Optional[nn.Module] = None  # the DistributedDataParallel wrapper (ddp, ep without fsdp)
    fsdp_root: Optional[nn.Module] = None  # the fully_shard-ed model (fsdp, ep with fsdp)
    expert_params: list = field(default_factory=list)  # (name, local parameter) held by this EP rank
    ep_mesh: Any = None  # DeviceMesh (edp, ep) of distributed=ep
    balance_hooks: list = field(default_factory=list)  # router forward hooks of the global balance loss
    ep_grad_bucket_bytes: int = 0  # distributed.ep_grad_bucket_mb in bytes (<= 0: one buffer)

    @property
    def ep_group(self):
        return self.ep_mesh.get_group("ep") if self.ep_mesh is not None else None

    @property
    def edp_group(self):
        return self.ep_mesh.get_group("edp") if self.ep_mesh is not None else None

    @contextlib.contextmanager
    def grad_sync(self, sync: bool):
        """Around one micro-batch: gradients are synchronised only on the last one of a step."""
        if self.ddp is not None and not sync:
            with self.ddp.no_sync():
                yield
            return
        if self.fsdp_root is not None:
            self.fsdp_root.set_requires_gradient_sync(sync)
        yield

    def after_backward(self, model: nn.Module) -> None:
        """After the last micro-batch: reduce what DDP/FSDP do not (EP expert gradients,
        non-gradient router statistics such as aux_free's load counts)."""
        if not self.dims.enabled:
            return
        reduce_expert_grads(self, self.ep_grad_bucket_bytes)
        reduce_router_counts(model, self.dims)

    def clip_grad_norm_(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        if self.dims.mode in ("none", "ddp"):
            return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return clip_grad_norm_(model, max_norm, self)


def uses_fsdp(cfg) -> bool:
    """Whether the run shards parameters with FSDP2: distributed=fsdp, or ep with distributed.fsdp."""
    d = cfg.distributed
    return d.name == "fsdp" or (d.name == "ep" and d.fsdp)


def fsdp_param_dtype(cfg, device: torch.device) -> str:
    """What FSDP2 computes the parameters in on `device`: "bf16" (`distributed.mixed_precision=bf16`, or
    `auto` on CUDA with train.dtype resolving to bf16; gradients reduce in fp32) or "fp32"."""
    mp = cfg.distributed.mixed_precision
    bf16 = mp == "bf16" or (mp == "auto" and device.type == "cuda"
                            and run_dtype(device, cfg.train.dtype, "train.dtype") == torch.bfloat16)
    return "bf16" if bf16 else "fp32"


def _mp_policy(cfg, device: torch.device):
    from torch.distributed.fsdp import MixedPrecisionPolicy
    if fsdp_param_dtype(cfg, device) == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def apply_fsdp(model: nn.Module, dims: ParallelDims, cfg, ignored: set) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(dims.device.type, (dims.world_size,), mesh_dim_names=("dp",))
    kw = dict(mesh=mesh, mp_policy=_mp_policy(cfg, dims.device))
    reshard = cfg.distributed.reshard_after_forward
    for block in model.layers:
        if block.is_moe:
            fully_shard(block.ffn.router, reshard_after_forward=reshard, **kw)
        block_ignored = {p for p in block.parameters() if p in ignored}
        fully_shard(block, reshard_after_forward=reshard, ignored_params=block_ignored or None, **kw)
    fully_shard(model, reshard_after_forward=False, ignored_params=ignored or None, **kw)
    return model


def apply_ddp(model: nn.Module, dims: ParallelDims, ignored_names: list) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP
    if ignored_names:  # EP expert weights: sharded, their gradients are reduced by reduce_expert_grads
        DDP._set_params_and_buffers_to_ignore_for_model(model, ignored_names)
    # No buffer sync in forward: buffers are either identical on every rank or per-rank statistics
    # (aux_free's load counts) that must not be overwritten by rank 0's. torch 2.13 renamed the
    # option (`broadcast_buffers` warns on every rank); the init-time broadcast the new one keeps is
    # harmless here: the model is freshly built, so its buffers are the same on every rank.
    params = inspect.signature(DDP).parameters
    sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}
    if "init_sync" in params:  # every rank already holds rank 0's weights (fill_from_rank0): no second broadcast
        sync["init_sync"] = False
    return DDP(model, device_ids=[dims.device.index] if dims.device.type == "cuda" else None, **sync)


def _expert_offsets(model: nn.Module, expert_params: list) -> dict[str, int]:
    """The global id of the first expert each local expert-parallel parameter holds."""
    out = {}
    for name, _ in expert_params:
        experts = model.get_submodule(name.rpartition(".")[0])
        assert isinstance(experts, ExpertParallelExperts)
        out[name] = experts.ep_rank * (experts.n_experts // experts.ep_size)
    return out


def parallelize(model: nn.Module, dims: ParallelDims, cfg) -> Parallelized:
    """Shard/wrap `model` (in place) for `dims.mode`; returns what was built."""
    if not dims.enabled:
        return Parallelized(dims, model)
    d = cfg.distributed
    hooks: list = []
    if dims.world_size > 1 and d.global_balance:
        hooks = attach_global_balance(model, dist.new_group(ranks=list(range(dims.world_size))))
    for m in model.modules():
        if hasattr(m, "_ensure_rows"):  # hash routing: a full-vocabulary table, one shape on every rank
            m._ensure_rows(model.cfg.vocab_size - 1)  # (its rows depend only on the token id)
    full = named_tensors(model)  # rank 0: the full tensors, kept alive until sent; elsewhere meta shapes
    expert_params: list = []
    ep_mesh = None
    if dims.mode == "ep":
        from torch.distributed.device_mesh import init_device_mesh
        ep_mesh = init_device_mesh(dims.device.type, (dims.world_size // dims.ep_size, dims.ep_size),
                                   mesh_dim_names=("edp", "ep"))
        expert_params = shard_experts(model, ep_mesh.get_local_rank("ep"), dims.ep_size, ep_mesh.get_group("ep"))
    fsdp = uses_fsdp(cfg)
    if fsdp:
        model = apply_fsdp(model, dims, cfg, {p for _, p in expert_params})
    if dims.world_size > 1:
        fill_from_rank0(model, full, dims, _expert_offsets(model, expert_params))
        # materialising a meta model made new Parameter objects for the plain (non-DTensor) ones
        expert_params = [(n, model.get_parameter(n)) for n, _ in expert_params]
    del full
    built = dict(dims=dims, expert_params=expert_params, ep_mesh=ep_mesh, balance_hooks=hooks,
                 ep_grad_bucket_bytes=int(d.ep_grad_bucket_mb * 2**20))
    if fsdp:
        return Parallelized(module=model, fsdp_root=model, **built)
    ddp = apply_ddp(model, dims, [n for n, _ in expert_params])
    return Parallelized(module=ddp, ddp=ddp, **built)
