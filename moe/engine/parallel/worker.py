"""A worker rank (1..T-1) of a tensor-parallel engine: a process spawned by rank 0 (`launch.py`).

It reads its shard of the checkpoint itself (in slices: shard_load.py), joins the group, builds a model runner over its
KV-cache shard with rank 0's settings, then runs one sharded forward per step plan rank 0 sends,
until told to stop or rank 0 is gone. Plans come over a multiprocessing queue, not a collective:
a worker may wait for the next request indefinitely, while the collectives inside a step keep a
timeout. Any error is reported to rank 0 (with its traceback) before the process exits non-zero.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import queue
import time
import traceback
from dataclasses import dataclass

import torch

from moe.attention import paged_backend
from moe.engine.parallel.comm import RankGroup, join_store
from moe.engine.parallel.runner import forward_step, rank_stats, to_device
from moe.engine.parallel.shard_load import load_shard
from moe.engine.runner.model_runner import ModelRunner

POLL_S = 0.5  # how often an idle worker checks that rank 0 is alive


@dataclass
class WorkerSpec:
    """What a worker needs to become rank `rank` (picklable: it crosses the spawn)."""

    rank: int
    size: int
    port: int
    checkpoint: str
    routing: dict | None
    device: str
    dtype: torch.dtype
    expert_parallel: bool
    num_threads: int
    timeout_s: float


def worker_main(spec: WorkerSpec, inbox: mp.Queue, outbox: mp.Queue) -> None:
    try:
        _serve(spec, inbox, outbox)
    except BaseException:  # noqa: BLE001 - every failure goes to rank 0 first, then the process exits non-zero
        outbox.put(("error", spec.rank, traceback.format_exc()))
        raise SystemExit(1)


def _next(inbox: mp.Queue):
    """The next message from rank 0; None once rank 0 is gone (then this worker ends quietly)."""
    parent = mp.parent_process()
    while True:
        try:
            return pickle.loads(inbox.get(timeout=POLL_S))  # rank 0 sends pickled bytes (launch.py)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return None


def _serve(spec: WorkerSpec, inbox: mp.Queue, outbox: mp.Queue) -> None:
    torch.set_num_threads(spec.num_threads)
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL runs on the current device
    group = RankGroup(spec.rank, spec.size, device)
    model, _tokenizer = load_shard(spec.checkpoint, group, spec.expert_parallel, device, spec.dtype, spec.routing)
    outbox.put(("loaded", spec.rank, None))
    group.connect(join_store(spec.port, spec.size, spec.timeout_s), spec.timeout_s)
    init = _next(inbox)
    if init is None or init[0] != "init":
        return
    _kind, num_blocks, block_size, max_model_len, backend_name = init
    model.rotary.extend(max_model_len)
    backend = paged_backend(backend_name, device, model.cfg)
    runner = ModelRunner(model, num_blocks, block_size, backend, device, spec.dtype)
    counters = {"steps": 0, "forward_s": 0.0}
    while (msg := _next(inbox)) is not None:
        if msg[0] == "step":
            _kind, ids, pos, meta, rows = msg
            t0 = time.perf_counter()
            forward_step(runner, ids.to(device), pos.to(device), to_device(meta, device), rows)
            counters["steps"] += 1
            counters["forward_s"] += time.perf_counter() - t0
        elif msg[0] == "stats":  # (the serving /metrics): answered after every step sent before it
            outbox.put(("stats", spec.rank, msg[1], rank_stats(spec.rank, runner, group, **counters)))
        else:
            return
