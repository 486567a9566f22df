"""Distributed training on torch.distributed: DDP, FSDP2 and expert parallelism.

    dims.py             ParallelDims: the frozen layout (mode, ranks, batch split) + small collectives
    setup.py            init_distributed: process group (NCCL / gloo), one device per process, checks
    parallel.py         parallelize(model, dims, cfg) -> Parallelized: ddp / fsdp / ep, what was built
    materialize.py      build_model: rank 0 initialises, the others build on meta and get their shards
    expert_parallel.py  experts split over ranks, tokens exchanged with all_to_all_single
    balance.py          the router balance loss over the global batch (router forward hooks)
    reduce.py           metrics, EP expert gradients, gradient clipping over shards
    checkpoint.py       torch.distributed.checkpoint save / load, at any world size

Launch: `torchrun --nproc_per_node=N train.py distributed=ddp|fsdp|ep` (docs/guides/distributed.md).
Nothing here imports the trainer; the trainer imports this.
"""

from moe.distributed.dims import ParallelDims
from moe.distributed.materialize import build_model
from moe.distributed.parallel import Parallelized, parallelize
from moe.distributed.setup import init_distributed, local_layout

__all__ = ["ParallelDims", "Parallelized", "build_model", "init_distributed", "local_layout", "parallelize"]
