"""The trainer's preemption guard in one process: the signal arriving mid-step stops the run at the
end of that step with a checkpoint, and only then reaches the handler that was installed before
(submitit's, in a job; here a recorder)."""

from __future__ import annotations

import os
import signal

import pytest

import moe.train.loop as loop
from moe.checkpoint import list_checkpoints
from moe.config import load_config
from moe.train import train
from moe.train.preemption import PreemptionGuard, preemption_signal
from tests.distributed.dist_helpers import raw_cfg


@pytest.mark.slow
def test_signal_mid_step_checkpoints_that_step_then_reaches_the_previous_handler(tmp_path, monkeypatch):
    sig = preemption_signal()
    seen = []  # (signal, step the trainer was at) as the previous handler saw them
    lr_at = loop.lr_at

    def lr_at_then_signal(step, *args):
        if step + 1 == 3:  # the loop asks for step 3's lr at its start
            os.kill(os.getpid(), sig)
        return lr_at(step, *args)

    def previous(signum, frame):
        seen.append((signum, [p.name for p in list_checkpoints(tmp_path / "run")]))

    monkeypatch.setattr(loop, "lr_at", lr_at_then_signal)
    before = signal.signal(sig, previous)
    try:
        summary = train(load_config(raw_cfg(tmp_path, train=dict(max_steps=6, ckpt_interval=100))), tmp_path / "run")
        assert signal.getsignal(sig) is previous  # the guard is gone once training returns
    finally:
        signal.signal(sig, before)
    assert summary["preempted"] and summary["step"] == 3 and summary["stopped_early"]
    # the previous handler ran once, after the checkpoint of step 3 (off the checkpoint interval) existed
    assert seen == [(sig, ["step_0000003.pt"])]


def test_no_signal_no_stop_and_the_guard_leaves_no_trace():
    sig = preemption_signal()
    before = signal.getsignal(sig)
    with PreemptionGuard() as guard:
        assert signal.getsignal(sig) == guard._record and not guard.received
    assert signal.getsignal(sig) == before
    guard.hand_over()  # nothing received: nothing delivered
