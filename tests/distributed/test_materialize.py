"""Rank 0 alone initialises the model; rank 1 builds it on the meta device and never holds a full
copy of a sharded tensor, yet every rank ends with exactly one process's initial weights.

tests/distributed/materialize_worker.py's checks (2 gloo processes) for ddp, fsdp, ep and ep+fsdp,
run in the torchrun launch the parity tests share (`dist_runs`, tests/distributed/conftest.py). The allocation watch is a TorchDispatchMode around build + parallelize on each
rank (independent of the code under test: it sees every tensor any operator returns). The
equivalence of whole training runs with one process is tests/distributed/test_parallel.py.
"""

from __future__ import annotations

import json

import pytest



@pytest.fixture(scope="module")
def ranks(dist_runs) -> list[dict]:
    out = dist_runs["materialize"]
    return [json.loads((out / f"out.rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp", "ep", "ep_fsdp"])
def test_every_rank_starts_from_one_process_initial_weights(ranks, mode):
    for rank, results in enumerate(ranks):
        r = results[mode]
        assert r["weights"] and max(r["weights"].values()) == 0.0, (rank, r["weights"])  # bit-exact, every tensor
        assert r["rng_equal"], rank  # the RNG continues as after one process's init
        assert r["tied"], rank  # the tied embedding / LM head is still one tensor
    assert not ranks[0][mode]["meta_after_build"]  # rank 0 initialises for real
    assert ranks[1][mode]["meta_after_build"]  # rank 1: nothing allocated, nothing initialised


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp", "ep_fsdp"])
def test_sharded_ranks_hold_only_their_shards(ranks, mode):
    r0, r1 = ranks[0][mode], ranks[1][mode]
    # Nothing larger than half of the largest full tensor was ever created on rank 1 (the scatter
    # receives exactly its shard), while rank 0 held the full model it initialised.
    assert r1["largest_storage"] <= r1["largest_full"] // 2
    assert r0["largest_storage"] >= r0["largest_full"]
    assert r1["local_bytes"] <= r1["full_bytes"] // 2 + 4096  # FSDP2 pads an odd row count


@pytest.mark.slow
def test_expert_parallel_ranks_hold_only_their_experts(ranks):
    r1 = ranks[1]["ep"]
    # The largest full tensor is an expert weight [8, 256, 64]: rank 1 holds 4 of its experts and
    # never the 8 (its largest allocation is DDP's gradient bucket of the replicated rest).
    assert r1["largest_storage"] < r1["largest_full"]
    assert r1["local_bytes"] < r1["full_bytes"]


@pytest.mark.slow
def test_ddp_ranks_hold_full_replicas(ranks):
    """The control: DDP replicates, so rank 1 does allocate full tensors (the watch sees them)."""
    r1 = ranks[1]["ddp"]
    assert r1["largest_storage"] >= r1["largest_full"] and r1["local_bytes"] == r1["full_bytes"]
