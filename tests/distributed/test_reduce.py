"""Bucketed expert-gradient reduction (`reduce.all_reduce_bucketed`, `reduce_expert_grads`) on 2
gloo processes: every bucket size gives exactly the sum a plain all-gather gives, and the same
result as one buffer for all gradients (the unbucketed reduction it replaces)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moe.distributed.reduce import grad_buckets, reduce_expert_grads
from tests.distributed.dist_helpers import free_port

SHAPES = [(4, 6, 8), (4, 8, 3), (7,), (4, 6, 8), (1, 1), (50,)]  # element counts 192, 96, 7, 192, 1, 50
BUCKETS = [0, 4, 200 * 4, 400 * 4, 10**9]  # bytes: one buffer, one per grad, mixed, mixed, everything


def test_buckets_cover_every_grad_once_within_the_size():
    grads = [torch.zeros(s) for s in SHAPES]
    for bucket_bytes in BUCKETS:
        buckets = grad_buckets(grads, bucket_bytes)
        assert [i for b in buckets for i in b] == list(range(len(grads)))  # in order, each once
        for b in buckets:
            size = sum(grads[i].numel() * 4 for i in b)
            assert len(b) == 1 or bucket_bytes <= 0 or size <= bucket_bytes
    assert len(grad_buckets(grads, 0)) == 1 and len(grad_buckets(grads, 4)) == len(grads)
    mixed = [torch.zeros(3), torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)]
    assert grad_buckets(mixed, 0) == [[0], [1, 2]]  # never one buffer across dtypes


def _grads(rank: int) -> list:
    g = torch.Generator().manual_seed(100 + rank)
    grads = [torch.randn(s, generator=g) for s in SHAPES]
    grads[2] = None if rank == 1 else grads[2]  # no token reached these experts on rank 1
    grads[4] = torch.randn(2, 2, generator=g).t()[:1, :1]  # a non-contiguous gradient view
    return grads


def _worker(rank: int, world: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {}
        for bucket_bytes in BUCKETS:
            params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
            for p, g in zip(params, _grads(rank)):
                p.grad = None if g is None else g.clone() if g.is_contiguous() else g
            par = SimpleNamespace(expert_params=[(f"p{i}", p) for i, p in enumerate(params)],
                                  dims=SimpleNamespace(world_size=world, ep_size=1), edp_group=None)
            reduce_expert_grads(par, bucket_bytes)
            results[bucket_bytes] = [p.grad.clone() for p in params]
        if rank == 0:
            out.update(results)
    finally:
        dist.destroy_process_group()


def test_bucketed_reduction_equals_the_plain_sum_on_two_processes():
    world = 2
    with mp.Manager() as manager:
        out = manager.dict()
        # fork: the workers inherit the imported torch instead of importing it again (~10 s each here)
        mp.start_processes(_worker, args=(world, free_port(), out), nprocs=world, join=True, start_method="fork")
        results = dict(out)
    # Reference: each rank's gradients (None = zeros), summed here, divided by the world size.
    per_rank = [[torch.zeros(s) if g is None else g for s, g in zip(SHAPES, _grads(r))] for r in range(world)]
    expected = [sum(gs) / world for gs in zip(*per_rank)]
    for bucket_bytes, grads in results.items():
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-7)
        for got, one_buffer in zip(grads, results[0]):
            assert torch.equal(got, one_buffer), bucket_bytes  # exactly the unbucketed result
