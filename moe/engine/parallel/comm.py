"""The collectives of one tensor-parallel engine: a process group of its own, no global state.

The group is built directly on a `TCPStore` (`ProcessGroupGloo` on CPU, `ProcessGroupNCCL` on
CUDA) instead of `torch.distributed.init_process_group`, so an engine in a user's process does not
take over (or collide with) that process's default group, and two engines can coexist. Every
collective has the group's timeout: a rank that stops answering fails the others' step with an
error instead of hanging them.

The communication time of each call is added to `comm_seconds`, so a benchmark can split a step
into compute and communication (on CPU the collectives are synchronous, so this is exact; on
CUDA it is the launch-to-wait time of the host, see benchmarks/engine_tp.py).
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist


class RankGroup:
    """This rank's view of the engine's process group: `all_reduce` (sum, in place) and
    `all_gather_last` (concatenate shards along the last dimension)."""

    def __init__(self, rank: int, size: int, device: torch.device):
        self.rank, self.size, self.device = rank, size, device
        self.store = self.pg = None  # `connect` joins the group (the model is sharded before that)
        self.comm_seconds = 0.0  # time spent in collectives since the last reset (benchmarks)

    def connect(self, store: dist.TCPStore, timeout_s: float) -> None:
        """Join the group through `store` (rank 0's, or a client of it): returns once every rank has."""
        timeout = timedelta(seconds=timeout_s)
        self.store = store
        if self.device.type == "cuda":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(store, self.rank, self.size, opts)
        else:
            self.pg = dist.ProcessGroupGloo(store, self.rank, self.size, timeout)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        x = x.contiguous()
        self.pg.allreduce([x]).wait()
        self.comm_seconds += time.perf_counter() - t0
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's equally shaped `x`, concatenated along the last dimension, rank by rank."""
        t0 = time.perf_counter()
        x = x.contiguous()
        outs = [[torch.empty_like(x) for _ in range(self.size)]]
        self.pg.allgather(outs, [x]).wait()
        self.comm_seconds += time.perf_counter() - t0
        return torch.cat(outs[0], dim=-1)


def create_store(size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's store on a free port (port 0: the OS picks; `store.port` says which)."""
    return dist.TCPStore("127.0.0.1", 0, size, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def join_store(port: int, size: int, timeout_s: float) -> dist.TCPStore:
    """A worker's client of rank 0's store."""
    return dist.TCPStore("127.0.0.1", port, size, False, timeout=timedelta(seconds=timeout_s))
