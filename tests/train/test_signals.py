"""SIGINT / SIGTERM become a request to stop after the current step (moe/train/signals.py);
tests/train/test_faults.py sends them to real `python train.py` processes."""

from __future__ import annotations

import os
import signal

import pytest

from moe.train.signals import StopSignals


def test_the_first_signal_asks_to_stop_a_second_ctrl_c_exits_and_handlers_are_restored():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with StopSignals() as stop:
        assert not stop.requested and stop.exit_code() == 0
        os.kill(os.getpid(), signal.SIGTERM)  # handled in this (the main) thread before kill returns
        assert stop.requested and stop.name == "SIGTERM"
        assert stop.exit_code() == 143 and stop.exit_code(zero=True) == 0  # train.exit_zero_on_signal
        os.kill(os.getpid(), signal.SIGTERM)  # a repeated SIGTERM changes nothing
        assert stop.name == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C after a stop request: exit at once
    assert {s: signal.getsignal(s) for s in before} == before
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.name == "SIGINT" and stop.exit_code() == 130
