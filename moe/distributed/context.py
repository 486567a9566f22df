"""`DistContext`: what the training loop asks of a distributed run, in one object.

The trainer calls the same methods whatever `distributed.name` is; with `none` every one of
them is the single-process behaviour (identity, or exactly the call the loop made before),
so a one-process run is unchanged. The work lives in the sibling modules:
`parallel.py` (DDP / FSDP2 / expert parallelism), `reduce.py` (metrics and gradients),
`checkpoint.py` (torch.distributed.checkpoint).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class DistContext:
    mode: str  # none | ddp | fsdp | ep
    device: torch.device
    local_batch: int  # sequences per rank per optimizer step (train.batch_size / world_size)
    local_accum: int  # micro-batches per rank per step
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: Optional[str] = None
    ep_size: int = 1
    created_process_group: bool = False
    # Set by `parallelize`:
    ddp: Optional[nn.Module] = None  # the DistributedDataParallel wrapper (ddp, ep without fsdp)
    fsdp_root: Optional[nn.Module] = None  # the fully_shard-ed model (fsdp, ep with fsdp)
    expert_params: list = field(default_factory=list)  # (name, local parameter) held by this EP rank
    ep_mesh: Any = None  # DeviceMesh (edp, ep) of distributed=ep
    balance_group: Any = None  # process group of the global balance-loss statistics

    # ------------------------------------------------------------------ who am I
    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dp_rank(self) -> int:  # every rank is a data-parallel rank (EP ranks included)
        return self.rank

    @property
    def dp_size(self) -> int:
        return self.world_size

    @property
    def ep_group(self):
        return self.ep_mesh.get_group("ep") if self.ep_mesh is not None else None

    @property
    def edp_group(self):
        return self.ep_mesh.get_group("edp") if self.ep_mesh is not None else None

    # ------------------------------------------------------------------ agreement
    def on_main(self, fn: Callable, *args, **kwargs):
        """Run `fn` on rank 0 and give every rank its result (or raise its exception everywhere)."""
        if not self.enabled or self.world_size == 1:
            return fn(*args, **kwargs)
        box: list = [None]
        if self.is_main:
            try:
                box[0] = ("ok", fn(*args, **kwargs))
            except Exception as e:  # every rank must raise it, or the others would wait forever
                box[0] = ("error", e)
        dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "error":
            raise value
        return value

    def barrier(self) -> None:
        if self.enabled and self.world_size > 1:
            dist.barrier()

    # ------------------------------------------------------------------ model
    def parallelize(self, model: nn.Module, cfg) -> nn.Module:
        """Shard/wrap `model` in place for this mode; returns the module to call for training."""
        if not self.enabled:
            return model
        from moe.distributed.parallel import parallelize
        return parallelize(model, self, cfg)

    def build_optimizer(self, model: nn.Module, cfg, device: torch.device):
        """`moe.train.optim.build_optimizer`; with EP under FSDP the expert weights (plain
        tensors) get param groups of their own, apart from the FSDP DTensors, because fused and
        foreach AdamW kernels take one kind of tensor per group."""
        from moe.train.optim import build_optimizer
        optimizer = build_optimizer(model, cfg, device)
        if self.fsdp_root is not None and self.expert_params:
            expert_ids = {id(p) for _, p in self.expert_params}
            groups = []
            for g in optimizer.param_groups:
                for keep in (False, True):
                    ps = [p for p in g["params"] if (id(p) in expert_ids) == keep]
                    if ps:
                        groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": ps})
            optimizer.param_groups[:] = groups
        return optimizer

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

    # ------------------------------------------------------------------ data
    def shard(self, items: list) -> list:
        """This rank's equal share of `items` (e.g. validation batches), or all of them when
        they do not split evenly (every rank must run the same number of forwards)."""
        if not self.enabled or len(items) % self.world_size != 0:
            return items
        return items[self.rank::self.world_size]

    # ------------------------------------------------------------------ metrics
    def mean(self, *values: float):
        """The mean over ranks of each float (one all-reduce); a float for one value, else a tuple."""
        out = self._means(values)
        return out[0] if len(out) == 1 else tuple(out)

    def mean_dict(self, d: dict) -> dict:
        keys = sorted(d)
        return dict(zip(keys, self._means([d[k] for k in keys])))

    def _means(self, values) -> list:
        if not self.enabled or self.world_size == 1 or not values:
            return list(values)
        from moe.distributed.reduce import mean_over_ranks
        return mean_over_ranks(values, self.device)

    def reduce_records(self, records: list) -> list:
        """Routing records of this rank's micro-batch -> the records of the global micro-batch."""
        if not self.enabled or self.world_size == 1 or not records:
            return records
        from moe.distributed.reduce import reduce_records
        return reduce_records(records, self.world_size, self.device)

    # ------------------------------------------------------------------ gradients
    def after_backward(self, model: nn.Module) -> None:
        """After the last micro-batch: reduce what DDP/FSDP do not (EP expert gradients,
        non-gradient router statistics such as aux_free's load counts)."""
        if not self.enabled:
            return
        from moe.distributed.reduce import reduce_expert_grads, reduce_router_counts
        reduce_expert_grads(self)
        reduce_router_counts(model, self)

    def clip_grad_norm_(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        if self.mode in ("none", "ddp"):
            return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        from moe.distributed.reduce import clip_grad_norm_
        return clip_grad_norm_(model, max_norm, self)

    # ------------------------------------------------------------------ checkpoints
    def read_checkpoint(self, path: Path) -> dict:
        from moe.checkpoint import read_checkpoint
        if not self.enabled:
            return read_checkpoint(path)
        from moe.distributed.checkpoint import read_resume_state
        return read_resume_state(path, self)

    def load_model_optimizer(self, model: nn.Module, optimizer, state: dict) -> None:
        if not self.enabled and "optimizer" in state:  # the single-process path, unchanged
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            return
        from moe.distributed.checkpoint import load_train_state
        load_train_state(model, optimizer, state, self)

    def save_checkpoint(self, run_dir: Path, step: int, model: nn.Module, optimizer, state: dict) -> Path:
        """`state` is the single-process checkpoint dict; distributed runs save its model and
        optimizer entries with torch.distributed.checkpoint (sharded) and the rest in meta.pt."""
        from moe.checkpoint import checkpoint_path, save_checkpoint
        if not self.enabled:
            return save_checkpoint(checkpoint_path(run_dir, step), state)
        from moe.distributed.checkpoint import save_train_state
        extra = {k: v for k, v in state.items() if k not in ("model", "optimizer")}
        return save_train_state(run_dir, step, model, optimizer, extra, self)

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        if self.enabled and self.created_process_group and dist.is_initialized():
            dist.destroy_process_group()


class NullLogger:
    """The logger of ranks other than 0: rank 0 alone writes metrics.jsonl, W&B and the console."""

    wandb_id = None

    def log(self, record: dict, loads=None, heatmap=None) -> None:
        pass

    def close(self) -> None:
        pass
