"""Distributed training on torch.distributed: DDP, FSDP2 and expert parallelism.

    setup.py            process group (NCCL / gloo), one device per process, layout checks
    context.py          DistContext: what the training loop calls (identity for distributed=none)
    parallel.py         apply ddp / fsdp / ep to the model
    expert_parallel.py  experts split over ranks, tokens exchanged with all_to_all_single
    balance.py          the router balance loss over the global batch
    reduce.py           metrics, EP expert gradients, gradient clipping over shards
    checkpoint.py       torch.distributed.checkpoint save / load, at any world size

Launch: `torchrun --nproc_per_node=N train.py distributed=ddp|fsdp|ep` (docs/distributed.md).
"""

from moe.distributed.context import DistContext, NullLogger
from moe.distributed.setup import init_distributed, local_layout

__all__ = ["DistContext", "NullLogger", "init_distributed", "local_layout"]
