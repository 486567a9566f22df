"""moe/checkpoint.py, for the survivors of its mutation re-run (docs/results/mutation/rerun2/README.md).

`fault_pause` with a mutated condition pauses where it should pass through; with the default
`until` (never true) that is a hang, which the mutation driver can only count as "past its time
limit". Here `until` records that the pause was entered and ends it at once, so the same mistake
fails in milliseconds.
"""

from __future__ import annotations

from moe.checkpoint import PAUSE_ENV, fault_pause


def test_fault_pause_passes_through_without_waiting_when_not_asked(monkeypatch, capsys):
    entered = []

    def until():
        entered.append(True)
        return True

    monkeypatch.delenv(PAUSE_ENV, raising=False)
    fault_pause("checkpoint-write", 4, "x", until=until)
    monkeypatch.setenv(PAUSE_ENV, "step-end:4")
    fault_pause("checkpoint-write", 4, "x", until=until)  # another point
    fault_pause("step-end", 5, "x", until=until)  # another step
    assert entered == [] and capsys.readouterr().err == ""
    fault_pause("step-end", 4, "x", until=until)  # its point and step: it waits, and says so
    assert entered == [True]
    assert capsys.readouterr().err == f"{PAUSE_ENV}: paused in step-end of step 4 (x)\n"
