"""MFU against a stated, stable peak (moe/perf.py): datasheet peaks for known GPUs, a CPU peak
measured once and cached with its conditions, refused when the machine is busy, and never an MFU
above 100%."""

from __future__ import annotations

import json

import pytest
import torch

from moe import perf
from moe.errors import ConfigError


@pytest.mark.parametrize("name, dtype, tf32, expected", [
    ("NVIDIA H100 80GB HBM3", "bf16", False, 989.4e12),  # SXM
    ("NVIDIA H100 80GB HBM3", "fp32", False, 66.9e12),
    ("NVIDIA H100 80GB HBM3", "fp32", True, 494.7e12),
    ("NVIDIA H100 PCIe", "bf16", False, 756e12),
    ("NVIDIA H100 NVL", "bf16", False, 835.5e12),
    ("NVIDIA H200", "bf16", False, 989.4e12),
    ("NVIDIA H200 NVL", "bf16", False, 835.5e12),
    ("NVIDIA A100-SXM4-80GB", "bf16", False, 312e12),
    ("NVIDIA A100 80GB PCIe", "fp32", True, 156e12),
    ("NVIDIA L40S", "bf16", False, 366.5e12),
    ("NVIDIA A10", "bf16", False, 125e12),
    ("NVIDIA L4", "bf16", False, 121e12),
    ("NVIDIA GeForce RTX 4090", "bf16", False, 165.2e12),
    ("NVIDIA A10G", "bf16", False, None),  # not the A10, not the A100: unknown
    ("Tesla T4", "bf16", False, None),
])
def test_datasheet_peaks(name, dtype, tf32, expected):
    found = perf.datasheet_peak(name, dtype, tf32=tf32)
    assert (found[0] if found else None) == expected


@pytest.fixture
def quiet_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path))
    monkeypatch.setattr(perf, "busy_reason", lambda: None)
    return tmp_path / "perf" / "matmul_peak.json"


def test_cpu_peak_is_measured_once_and_cached_with_its_conditions(quiet_cache, monkeypatch):
    monkeypatch.setattr(perf, "time_matmuls", lambda *a, **k: [50e9, 49e9, 48e9, 50e9, 47e9, 49e9, 50e9, 48e9, 49e9])
    peak = perf.resolve_peak(torch.device("cpu"), "fp32")
    assert peak.flops == 50e9 and "measured now" in peak.source
    entry = next(iter(json.loads(quiet_cache.read_text()).values()))
    assert entry["flops"] == 50e9 and entry["dtype"] == "fp32" and entry["threads"] == torch.get_num_threads()
    assert entry["torch"] == torch.__version__ and entry["device"] == perf.cpu_name()

    def no_more_measuring(*a, **k):
        raise AssertionError("a cached peak is not measured again")
    monkeypatch.setattr(perf, "time_matmuls", no_more_measuring)
    again = perf.resolve_peak(torch.device("cpu"), "fp32")
    assert again.flops == 50e9 and again.source.startswith("measured ")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)  # other conditions: not that measurement
    with pytest.raises(AssertionError, match="not measured again"):
        perf.resolve_peak(torch.device("cpu"), "fp32")
    assert perf.resolve_peak(torch.device("cpu"), "fp32", given=1e12).flops == 1e12  # train.peak_flops wins


def test_a_measurement_on_a_busy_machine_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path))
    monkeypatch.setattr(perf.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr(perf.os, "cpu_count", lambda: 2)
    peak = perf.resolve_peak(torch.device("cpu"), "fp32")
    assert peak.flops is None and "busy (load average 9.0 on 2 cores)" in peak.source
    assert "no MFU" in peak.describe() and not (tmp_path / "perf" / "matmul_peak.json").exists()


def test_scattered_timings_are_refused(quiet_cache, monkeypatch):
    monkeypatch.setattr(perf, "time_matmuls", lambda *a, **k: [60e9, 20e9, 25e9, 18e9, 30e9, 22e9, 55e9, 21e9, 19e9])
    peak = perf.resolve_peak(torch.device("cpu"), "fp32")
    assert peak.flops is None and "timings scatter" in peak.source and not quiet_cache.exists()


def test_mfu_is_never_above_one(quiet_cache, monkeypatch, caplog):
    monkeypatch.setattr(perf, "time_matmuls", lambda *a, **k: [1e9] * 9)
    meter = perf.MFUMeter(perf.resolve_peak(torch.device("cpu"), "fp32"), flops_per_token=1e6)
    assert meter.measure(500.0) == {"perf/model_flops_per_s": 5e8, "perf/mfu": 0.5}
    assert quiet_cache.exists()
    out = meter.measure(3000.0)  # 3 GFLOP/s on a "1 GFLOP/s" device: the peak was wrong
    assert out == {"perf/model_flops_per_s": 3e9}
    assert "MFU is no longer reported" in caplog.text and json.loads(quiet_cache.read_text()) == {}
    assert "perf/mfu" not in meter.measure(500.0)  # not again for this run
    with pytest.raises(ValueError, match="MFU cannot exceed 100%"):
        perf.mfu(3e9, 1e9)
    assert perf.format_perf({"perf/model_flops_per_s": 3e9}) == "3.0 GFLOP/s"
    assert perf.format_perf({"perf/model_flops_per_s": 3e9, "perf/mfu": 0.381}) == "mfu 38.1%"


def test_estimate_mfu_refuses_a_peak_below_the_achieved_rate():
    from moe.model import Transformer
    from tests.conftest import tiny_model_config
    m = Transformer(tiny_model_config())
    f = m.flops_per_token(16)
    assert m.estimate_mfu(1000.0, 16, peak_flops=f * 2000.0) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="exceeds peak_flops"):
        m.estimate_mfu(1000.0, 16, peak_flops=f * 10.0)


# ---------------------------------------------------------------- dtype / TF32 defaults by device

def test_auto_dtype_is_fp32_on_cpu_and_names_stay_overridable(caplog):
    import logging

    from moe.perf import device_defaults, run_dtype
    cpu = torch.device("cpu")
    with caplog.at_level(logging.INFO, logger="moe"):
        assert device_defaults(cpu, "auto", what="eval") == torch.float32
    assert "eval: dtype fp32 (auto on cpu), TF32 matmuls n/a on cpu" in caplog.text
    assert run_dtype(cpu, None) == torch.float32 and run_dtype(cpu, "bf16") == torch.bfloat16
    with pytest.raises(ConfigError, match=r"train.dtype='fp8' is not one of \['auto', 'bf16'"):
        run_dtype(cpu, "fp8", field="train.dtype")


def test_on_cuda_auto_is_bf16_and_tf32_is_switched_as_asked(monkeypatch, caplog):
    """With a (pretended) bf16-capable GPU: auto = bf16, fp32 matmuls allowed TF32 unless tf32=False;
    a given dtype wins. Only torch's global flags are touched (restored afterwards)."""
    import logging

    from moe.perf import device_defaults
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
              torch.get_float32_matmul_precision())
    cuda = torch.device("cuda")
    try:
        with caplog.at_level(logging.INFO, logger="moe"):
            assert device_defaults(cuda, "auto", tf32=True, what="train") == torch.bfloat16
            assert torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "high"
            assert device_defaults(cuda, "fp32", tf32=False, what="train") == torch.float32
            assert not torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "highest"
        assert "train: dtype bf16 (auto on cuda), TF32 matmuls on" in caplog.text
        assert "train: dtype fp32 (given), TF32 matmuls off" in caplog.text
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[:2]
        torch.set_float32_matmul_precision(before[2])
