"""benchmarks/activation_memory.py runs, finds the checkpointed run identical, and reports that
checkpointing keeps far less for backward (tiny shapes; the recorded figures are in docs/guides/training.md)."""

import json

import pytest

from benchmarks.activation_memory import main


@pytest.mark.slow  # builds two tiny models through Hydra (~3 s of CPU)
def test_benchmark_reports_less_saved_memory_and_identical_results(capsys):
    assert main(["--batch", "2", "--seq", "16", "--steps", "1", "--vocab", "256"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["same_loss_and_grads"] and out["loss_none"] == out["loss_full"]
    assert out["saved_MiB_full"] < 0.5 * out["saved_MiB_none"]
    assert 0 < out["step_cpu_s_none"] and 0 < out["step_cpu_s_full"]
    assert out["cpu_time_ratio_full_over_none"] == round(out["step_cpu_s_full"] / out["step_cpu_s_none"], 3)
