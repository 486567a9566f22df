"""Start a tensor-parallel engine from one process: `LLM(path, tensor_parallel_size=T)`.

The calling process is rank 0 (scheduler, block manager, sampler, and its own model shard); it
spawns ranks 1..T-1 with `multiprocessing`'s spawn start method (no torchrun: a user or a test
just builds an `LLM`), on CPU each with the caller's torch thread count, on CUDA rank r on
`cuda:r`. Order, so that a bad layout costs no process and a dead worker no hang:

    rank 0 reads the checkpoint's config, checks the layout (ConfigError)  ->  spawns the workers
    -> reads its own shard in slices (shard_load.py; every worker reads its own the same way)
    -> waits for every worker's "loaded" (a worker's error or death is raised with its traceback)
    -> all ranks join the group (rendezvous on rank 0's TCPStore, a free port)
    -> rank 0 builds the engine (KV blocks sized on its shard) and sends the workers its settings.

Workers are daemon processes: they end with rank 0, and also leave on their own when rank 0's
process is gone (worker.py polls it). `Workers.stop` (called by `LLM.shutdown` and at garbage
collection) asks them to stop and joins them.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import queue
import time
import weakref
from typing import Optional

import torch
from torch import nn

from moe.engine.config import EngineConfig
from moe.engine.parallel.comm import RankGroup, create_store
from moe.engine.parallel.layout import check_layout, check_not_quantized, check_plain_modules  # noqa: F401
from moe.engine.parallel.runner import ParallelRunner, RankFailure
from moe.engine.parallel.shard_load import load_shard, model_config_of, open_source
from moe.engine.parallel.worker import WorkerSpec, worker_main

# Seconds a collective (or the start-up rendezvous) may wait for a peer before the step fails.
COLLECTIVE_TIMEOUT_S = 120.0
LOAD_TIMEOUT_S = 600.0  # how long rank 0 waits for the workers to load their checkpoint


class Workers:
    """The worker processes of one engine, their inboxes and the one outbox they report to."""

    def __init__(self, specs: list[WorkerSpec]):
        ctx = mp.get_context("spawn")
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in specs]
        self.procs = [ctx.Process(target=worker_main, args=(s, q, self.outbox), daemon=True,
                                  name=f"moe-tp-rank{s.rank}") for s, q in zip(specs, self.inboxes)]
        self.errors: dict[int, str] = {}
        self.stats_asked = 0  # the id of the last stats request (a late answer to an earlier one is dropped)
        self._stats: dict[int, dict] = {}
        for p in self.procs:
            p.start()

    def send(self, msg) -> None:
        # Pickled here, once, into bytes: a Queue pickles on its feeder thread, and torch's
        # multiprocessing reducers would move the step's tensors into shared memory there, while
        # rank 0's forward reads them (a race that corrupted positions). Plain pickling copies.
        data = pickle.dumps(msg)
        for q in self.inboxes:
            q.put(data)

    def _drain(self) -> list:
        got = []
        while True:
            try:
                msg = self.outbox.get_nowait()
            except queue.Empty:
                return got
            if msg[0] == "error":
                self.errors[msg[1]] = msg[2]
            elif msg[0] == "stats" and msg[2] == self.stats_asked:
                self._stats[msg[1]] = msg[3]
            got.append(msg)

    def dead(self) -> str:
        """'' while every worker runs; else which died, how, and its reported error."""
        self._drain()
        for rank, p in enumerate(self.procs, start=1):
            if not p.is_alive():
                time.sleep(0.2)  # let its error message arrive
                self._drain()
                err = self.errors.get(rank, "").strip().splitlines()
                why = f": {err[-1]}" if err else ""
                return f"tensor-parallel rank {rank} (pid {p.pid}) exited with code {p.exitcode}{why}"
        return ""

    def stats(self, timeout_s: float) -> list[dict]:
        """Every worker's `rank_stats` (ranks 1..T-1, in order); a RankFailure if one died or did not answer."""
        self.stats_asked += 1
        self._stats = {}
        self.send(("stats", self.stats_asked))
        deadline = time.monotonic() + timeout_s
        while len(self._stats) < len(self.procs):
            dead = self.dead()
            if dead:
                raise RankFailure(dead)
            if time.monotonic() > deadline:
                raise RankFailure(f"tensor-parallel ranks {sorted(set(range(1, len(self.procs) + 1)) - set(self._stats))}"
                                  f" did not answer within {timeout_s:.0f} s")
            time.sleep(0.005)
        return [self._stats[r] for r in range(1, len(self.procs) + 1)]

    def wait_loaded(self, timeout_s: float) -> None:
        loaded, deadline = set(), time.monotonic() + timeout_s
        while len(loaded) < len(self.procs):
            loaded |= {m[1] for m in self._drain() if m[0] == "loaded"}
            dead = self.dead()
            if dead:
                self.stop()
                raise RankFailure(f"{dead} while loading the checkpoint")
            if time.monotonic() > deadline:
                self.stop()
                raise RankFailure(f"tensor-parallel workers {sorted(set(range(1, len(self.procs) + 1)) - loaded)} "
                                  f"did not load the checkpoint within {timeout_s:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        for q, p in zip(self.inboxes, self.procs):
            if p.is_alive():
                q.put(("stop",))
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def start_ranks(checkpoint, config: EngineConfig, device: torch.device, dtype: Optional[torch.dtype],
                routing) -> tuple[nn.Module, object, RankGroup, Workers]:
    """Check the layout on the checkpoint's config, spawn ranks 1..T-1, read rank 0's shard (in
    slices, `shard_load.py`) and join the group: (rank 0's model shard, tokenizer, group, workers)."""
    T = config.tensor_parallel_size
    source = open_source(checkpoint)  # its config and tensor index: no weight is read yet
    cfg, quantized = (source.model_cfg, source.quantized) if source is not None else model_config_of(checkpoint)
    check_layout(cfg, T, config.expert_parallel)
    check_not_quantized(quantized, T)
    store = create_store(T, COLLECTIVE_TIMEOUT_S)
    specs = [WorkerSpec(r, T, store.port, str(checkpoint), routing, _rank_device(device, r), dtype,
                        config.expert_parallel, torch.get_num_threads(), COLLECTIVE_TIMEOUT_S) for r in range(1, T)]
    workers = Workers(specs)
    group = RankGroup(0, T, device)
    try:
        model, tokenizer = load_shard(checkpoint, group, config.expert_parallel, device, dtype, routing, source)
    except BaseException:
        workers.stop()
        raise
    del source  # (a checkpoint file's memory map)
    workers.wait_loaded(LOAD_TIMEOUT_S)
    group.connect(store, COLLECTIVE_TIMEOUT_S)
    return model, tokenizer, group, workers


def attach(engine, workers: Workers, group: RankGroup) -> ParallelRunner:
    """After rank 0's engine is built: the workers build their runners with its settings; the
    engine's runner becomes the `ParallelRunner` that drives them."""
    workers.send(("init", engine.num_blocks, engine.block_size, engine.max_model_len, engine.backend.name))
    weakref.finalize(engine, workers.stop)
    return ParallelRunner(engine.runner, workers, group)


def _rank_device(device: torch.device, rank: int) -> str:
    return f"cuda:{rank}" if device.type == "cuda" else str(device)


