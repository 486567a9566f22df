"""2 processes (gloo, started through torchrun) train exactly the run one process trains.

For ddp, fsdp, ep and ep+fsdp, with the same config (global batch 4, seed 0) as a
`distributed=none` run: the loss of each of the first 10 steps, the gradient norm, the
router balance/z losses, the validation loss and the expert load of every MoE layer match.

Tolerance: the ranks compute the same sums in a different order (per-rank means averaged,
gradients all-reduced, sharded norms), and fp32 rounds each order differently: observed
differences are ~2e-7 relative after 10 AdamW steps; RTOL = 1e-5 leaves room for other
BLAS/thread counts while any real error (a wrong batch shard: ~1e-2; a gradient off by the
world size: the grad norm doubles) is far outside it. Expert loads are integer counts and
come out identical; ties between two experts' router scores may flip under fp32 reordering,
so up to 2 of the 128 assignments of a step may move (LOAD_ATOL), and most must be exact.
"""

from __future__ import annotations

import pytest
import torch

from moe.checkpoint import list_checkpoints
from moe.loading import load_model
from tests.distributed.dist_helpers import MODES, STEPS, by_step, read_loads, read_metrics

RTOL = 1e-5
ASSIGNMENTS_PER_STEP = 4 * 16 * 2  # batch x seq_len x top_k
LOAD_ATOL = 2 / ASSIGNMENTS_PER_STEP + 1e-12
KEYS = ["train/loss", "train/aux_loss", "train/grad_norm", "moe/aux_loss", "moe/z_loss", "moe/token_entropy",
        "val/loss"]


def assert_same_run(ref_dir, other_dir, keys=KEYS, steps=range(1, STEPS + 1), loads=True):
    ref, other = read_metrics(ref_dir), read_metrics(other_dir)
    assert [r["step"] for r in other] == [r["step"] for r in ref]
    for key in keys:
        a, b = by_step(ref, key), by_step(other, key)
        for s in steps:
            if s in a:
                assert b[s] == pytest.approx(a[s], rel=RTOL), (key, s, a[s], b[s])
    if loads:
        la, lb = read_loads(ref_dir), read_loads(other_dir)
        assert sorted(lb) == sorted(la) == list(steps)
        diffs = [abs(x - y) for s in steps for ra, rb in zip(la[s], lb[s]) for x, y in zip(ra, rb)]
        assert max(diffs) <= LOAD_ATOL, max(diffs)
        assert sum(d == 0 for d in diffs) >= 0.9 * len(diffs)


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_two_processes_match_one_process(dist_runs, mode):
    assert_same_run(dist_runs["ref"], dist_runs[mode])
    # The console/metrics numbers are rank 0's only after reduction: the global load sums to 1.
    loads = read_loads(dist_runs[mode])[STEPS]
    assert all(sum(layer) == pytest.approx(1.0) for layer in loads)


@pytest.mark.slow
def test_activation_checkpointing_under_ep_and_fsdp_matches_one_process(dist_runs):
    """Blocks recomputed in backward under FSDP2 (routers are FSDP units of their own inside the
    checkpointed block) and expert parallelism (all-to-all in the recomputation too), with the
    global balance loss's all-reduce hook running again: the same run as one process without it."""
    assert_same_run(dist_runs["ref"], dist_runs["ep_fsdp_ckpt"])


@pytest.mark.slow
def test_gradient_accumulation_per_rank_matches_one_process(dist_runs):
    """grad_accum=4 on one process = 2 ranks x 2 micro-batches (no_sync, expert grads
    accumulated locally). The balance loss is per micro-batch, and the micro-batches differ
    (one process: 1 sequence; 2 ranks: the union of 2), so it is off here and not compared."""
    assert_same_run(dist_runs["ref_accum"], dist_runs["ep_accum"],
                    keys=["train/loss", "train/grad_norm", "moe/z_loss", "val/loss"])


@pytest.mark.slow
def test_distributed_checkpoints_are_dcp_directories_that_load_model_reads(dist_runs):
    run = dist_runs["ep_fsdp"]
    ckpts = list_checkpoints(run)
    assert [p.name for p in ckpts] == ["step_0000005", "step_0000010"]
    files = sorted(p.name for p in ckpts[-1].iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp dirs left
    ref_model, tok, _ = load_model(dist_runs["ref"])
    model, tok2, cfg = load_model(run)  # experts saved as 2 shards, dense weights FSDP-sharded
    assert cfg.distributed.name == "ep" and not model.training
    ref_sd, sd = ref_model.state_dict(), model.state_dict()
    assert sorted(sd) == sorted(ref_sd)
    for k in sd:
        torch.testing.assert_close(sd[k], ref_sd[k], rtol=1e-4, atol=1e-5)
    x = torch.tensor([tok2.encode("ROMEO:")])
    torch.testing.assert_close(model(x).logits, ref_model(x).logits, rtol=1e-4, atol=1e-4)
