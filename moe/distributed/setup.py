"""Start a distributed run: process group, one device per process, and the layout checks.

`init_distributed(cfg, device)` is the first thing `train` does; it returns a frozen
`ParallelDims`. With `distributed=none` it describes one process and touches nothing (the existing single-process path).
Otherwise it joins (or creates) the default process group, NCCL on CUDA and gloo on CPUs,
from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT); a plain
`python train.py distributed=ddp` runs as a world of one. Then it checks that the layout is
possible (world size divisible by `ep_size`, the global batch divisible by the data-parallel
degree) and raises a ConfigError naming the numbers when it is not: the same on every rank,
so every rank stops.
"""

from __future__ import annotations

import logging
import math
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from moe.config import Config
from moe.errors import ConfigError
from moe.distributed.dims import ParallelDims

log = logging.getLogger("moe")


def _backend(name: str, device: torch.device) -> str:
    if name == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if name == "nccl" and device.type != "cuda":
        raise ConfigError(f"distributed.backend=nccl needs CUDA devices (train.device resolved to {device}); "
                          "use distributed.backend=gloo or auto")
    return name


def local_layout(batch_size: int, grad_accum: int, dp_size: int) -> tuple[int, int]:
    """(sequences per rank per step, micro-batches per rank per step) for a global batch.

    `train.batch_size` is the global batch and `train.grad_accum` the number of micro-batches
    it is cut into on one process. With `dp_size` ranks each takes `batch_size / dp_size`
    sequences in `ceil(grad_accum / dp_size)` micro-batches: a micro-batch is never larger
    than on one process, and accumulation fills what fewer ranks cannot hold at once.
    """
    if batch_size % dp_size != 0:
        raise ConfigError(f"train.batch_size={batch_size} is the global batch and must be divisible by the "
                          f"data-parallel world size {dp_size}")
    local_batch = batch_size // dp_size
    local_accum = math.ceil(grad_accum / dp_size)
    if local_batch % local_accum != 0:
        raise ConfigError(f"train.batch_size={batch_size} over {dp_size} ranks is {local_batch} sequences per rank, "
                          f"not divisible into {local_accum} micro-batches (train.grad_accum={grad_accum} / "
                          f"{dp_size} ranks, rounded up); change train.batch_size or train.grad_accum")
    return local_batch, local_accum


def check_layout(cfg: Config, world_size: int) -> None:
    d = cfg.distributed
    if d.name == "ep":
        if world_size % d.ep_size != 0:
            raise ConfigError(f"the world size {world_size} must be divisible by distributed.ep_size={d.ep_size} "
                              "(expert-parallel groups of ep_size ranks, replicated world_size / ep_size times)")
        if cfg.model.n_experts % d.ep_size != 0:
            raise ConfigError(f"model.n_experts={cfg.model.n_experts} must be divisible by "
                              f"distributed.ep_size={d.ep_size}")
    local_layout(cfg.train.batch_size, cfg.train.grad_accum, world_size)


def init_distributed(cfg: Config, device: torch.device) -> ParallelDims:
    d, tc = cfg.distributed, cfg.train
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if d.name == "none":
        if env_world > 1:
            raise ConfigError(f"this process is one of WORLD_SIZE={env_world} (torchrun) but distributed=none: each "
                              "would train its own copy; add distributed=ddp, distributed=fsdp or distributed=ep")
        return ParallelDims(mode="none", device=device, local_batch=tc.batch_size, local_accum=tc.grad_accum)

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} CUDA devices are "
                              "visible: start one process per device (torchrun --nproc_per_node)")
        device = torch.device("cuda", local_rank)  # one process per device
        torch.cuda.set_device(device)
    backend = _backend(d.backend, device)
    created = False
    if not dist.is_initialized():
        timeout = timedelta(seconds=d.timeout_s)
        if "MASTER_ADDR" in os.environ and "RANK" in os.environ:
            dist.init_process_group(backend, timeout=timeout, device_id=device if device.type == "cuda" else None)
        elif env_world == 1:  # `python train.py distributed=...` without torchrun: a world of one
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            raise ConfigError(f"WORLD_SIZE={env_world} is set but MASTER_ADDR/RANK are not: launch with torchrun")
        created = True
    rank, world = dist.get_rank(), dist.get_world_size()
    check_layout(cfg, world)
    local_batch, local_accum = local_layout(tc.batch_size, tc.grad_accum, world)
    if rank != 0:
        logging.getLogger("moe").setLevel(logging.WARNING)  # rank 0 speaks for the run
    dims = ParallelDims(mode=d.name, device=device, rank=rank, world_size=world, local_rank=local_rank,
                      backend=dist.get_backend(), local_batch=local_batch, local_accum=local_accum,
                      ep_size=d.ep_size if d.name == "ep" else 1, created_process_group=created)
    log.info("distributed=%s: %d processes (%s), %s per process; global batch %d = %d ranks x %d sequences "
             "in %d micro-batch(es)%s", d.name, world, dims.backend, device, tc.batch_size, world, local_batch,
             local_accum, f"; {cfg.model.n_experts // d.ep_size} experts per rank (ep_size={d.ep_size})"
             if d.name == "ep" else "")
    return dims
