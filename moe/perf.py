"""Device selection and the peak that MFU (model FLOPs utilisation) is measured against.

MFU = achieved model FLOP/s / the device's peak FLOP/s, and it means something only against a
stated, stable peak. `resolve_peak` takes, in this order:

1. `train.peak_flops` when the user gives it;
2. on a known GPU, the datasheet's dense peak for the training dtype (`DATASHEET_PEAKS`);
3. otherwise a matmul peak measured once and cached with its conditions (CPU model, threads,
   dtype, torch version) in `$MOE_LAB_CACHE/perf/matmul_peak.json`, so every later run on the
   same machine and settings divides by the same number. A measurement is refused, and the run
   reports no MFU, when the machine is busy or the timings scatter: a matmul timed under load
   reads low and turns a slow run into "177% MFU".

`MFUMeter` turns tokens/s into `perf/model_flops_per_s` (always) and `perf/mfu` (only with a
peak). Achieved FLOP/s above the peak prove the peak wrong: MFU is then no longer reported (never
above 100%), a warning says why, and a cached measurement is dropped so the next run re-measures.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from moe.dtypes import DTYPES, dtype_name, resolve_dtype
from moe.errors import ConfigError

log = logging.getLogger("moe")


def resolve_device(name: str = "auto", field: str = "train.device") -> torch.device:
    """`auto` (CUDA when available, else CPU) or a torch device name; `field` names the option in errors."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(f"{field}={name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{field}={name!r} but CUDA is not available here; use 'cpu' or 'auto'")
    return dev


def auto_dtype(device: torch.device) -> torch.dtype:
    """What dtype `auto` means on `device`: bf16 on a CUDA GPU that has it (half the memory of fp32,
    and the grouped-matmul expert dispatch needs it), fp32 elsewhere (CPU bf16 matmuls are slow
    and tests compare against fp32 references)."""
    if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def run_dtype(device: torch.device, dtype: Any = "auto", field: str = "dtype") -> torch.dtype:
    """`dtype` ("auto", None, a name of moe.dtypes.DTYPES or a torch dtype) resolved for `device`."""
    if dtype is None or (isinstance(dtype, str) and dtype.lower() == "auto"):
        return auto_dtype(device)
    try:
        return resolve_dtype(dtype, field=field)
    except ConfigError:
        raise ConfigError(f"{field}={dtype!r} is not one of {['auto', *sorted(DTYPES)]}") from None


def device_defaults(device: torch.device, dtype: Any = "auto", tf32: bool = True, what: str = "run",
                    field: str = "dtype") -> torch.dtype:
    """The one place a run's numeric defaults are decided: returns the dtype to run in (`run_dtype`)
    and, on CUDA, lets fp32 matmuls use TF32 tensor cores unless `tf32=False` (torch's default is
    off: ~8x slower fp32 matmuls on an H100/H200, for a 10-bit mantissa that training and inference
    in bf16 never see). Logged, so a run's record says what it ran in."""
    resolved = run_dtype(device, dtype, field)
    how = f"auto on {device.type}" if dtype is None or str(dtype).lower() == "auto" else "given"
    log.info("%s: dtype %s (%s), TF32 matmuls %s", what, dtype_name(resolved), how, set_tf32(device, tf32))
    return resolved


def set_tf32(device: torch.device, tf32: bool) -> str:
    """On CUDA, let fp32 matmuls (and cuDNN convolutions) use TF32 tensor cores, or forbid it; a
    no-op elsewhere. Returns the state for a log line ("on", "off", "n/a on cpu")."""
    if device.type != "cuda":
        return "n/a on " + device.type
    torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
    torch.backends.cudnn.allow_tf32 = bool(tf32)
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    return "on" if tf32 else "off"


# Dense (no 2:4 sparsity) peak FLOP/s per GPU, from NVIDIA's datasheets (their tensor-core figures
# are quoted "with sparsity": halved here). fp32 = plain FP32 on CUDA cores (PyTorch's default for
# fp32 matmuls); tf32 = TF32 tensor cores (when torch allows TF32 for fp32 matmuls); bf16 =
# BF16 tensor cores with FP32 accumulation.
#   H100 SXM / H200 / GH200: H100 and H200 datasheets (67 / 989 / 1979 TFLOPS fp32 / tf32* / bf16*)
#   H100 PCIe: H100 datasheet (51 / 756* / 1513*); H100 NVL, H200 NVL: datasheets (60 / 835* / 1671*)
#   A100 (SXM4 and PCIe, 40/80 GB): A100 datasheet (19.5 / 156 / 312, dense)
#   L40S: L40S datasheet (91.6 / 366* / 733*); A10: A10 datasheet (31.2 / 125* / 250*)
#   L4: L4 datasheet (30.3 / 120* / 242*); RTX 4090: Ada architecture whitepaper, appendix
#   (82.6 FP32, 82.6 TF32 dense, 165.2 BF16 dense with FP32 accumulate)
DATASHEET_PEAKS: list[tuple[str, str, dict[str, float]]] = [  # (name pattern, label, dtype -> FLOP/s)
    (r"\bH100\b.*\bPCIe\b", "NVIDIA H100 PCIe", {"fp32": 51.2e12, "tf32": 378e12, "bf16": 756e12}),
    (r"\bH[12]00\b.*\bNVL\b", "NVIDIA H100/H200 NVL", {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12}),
    (r"\b(GH200|H200|H100)\b", "NVIDIA H100/H200 SXM", {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12}),
    (r"\bA100\b", "NVIDIA A100", {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12}),
    (r"\bL40S\b", "NVIDIA L40S", {"fp32": 91.6e12, "tf32": 183e12, "bf16": 366.5e12}),
    (r"\bA10\b", "NVIDIA A10", {"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12}),
    (r"\bL4\b", "NVIDIA L4", {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12}),
    (r"\bRTX 4090\b", "NVIDIA GeForce RTX 4090", {"fp32": 82.6e12, "tf32": 82.6e12, "bf16": 165.2e12}),
]


def datasheet_peak(device_name: str, dtype: str, tf32: bool = False) -> Optional[tuple[float, str]]:
    """(dense peak FLOP/s, "label dtype") of a known GPU for a training dtype (fp32 | bf16), or None."""
    kind = "tf32" if dtype == "fp32" and tf32 else dtype
    for pattern, label, peaks in DATASHEET_PEAKS:
        if re.search(pattern, device_name, flags=re.IGNORECASE) and kind in peaks:
            return peaks[kind], f"{label} {kind}"
    return None


@functools.lru_cache(maxsize=None)
def measure_matmul_peak(device: str = "cpu", dtype: str = "fp32", n: int = 1024, repeats: int = 5) -> float:
    """Best achieved FLOP/s of an n x n x n matmul on `device` (a benchmark's practical ceiling;
    training's MFU uses `resolve_peak`, which caches a checked measurement)."""
    return max(time_matmuls(device, dtype, n, repeats))


def time_matmuls(device: str = "cpu", dtype: str = "fp32", n: int = 1024, repeats: int = 5) -> list[float]:
    """FLOP/s of each of `repeats` timed n x n x n matmuls (after one warm-up)."""
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    dev = torch.device(device)
    if dev.type == "cuda":
        n = max(n, 8192)
    # A private generator: measuring must not consume the training RNG stream (a resumed run
    # measures again and would otherwise draw different jitter noise than an uninterrupted one).
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=dt, generator=gen)
    b = torch.randn(n, n, device=dev, dtype=dt, generator=gen)
    rates = []
    for i in range(repeats + 1):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t = time.perf_counter()
        a @ b
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if i:  # the first call warms up
            rates.append(2 * n ** 3 / (time.perf_counter() - t))
    return rates


@dataclass(frozen=True)
class Peak:
    """The peak MFU is reported against: `flops` None means no MFU, and `source` says why."""

    flops: Optional[float]
    source: str
    cache_key: Optional[str] = None  # set for a cached CPU measurement (dropped if proven wrong)

    def describe(self) -> str:
        if self.flops is None:
            return f"no MFU ({self.source}); perf/model_flops_per_s is logged"
        return f"MFU against {self.flops / 1e9:,.1f} GFLOP/s ({self.source})"


def cache_file() -> Path:
    root = os.environ.get("MOE_LAB_CACHE") or "~/.cache/moe-lab"
    return Path(os.path.expanduser(root)) / "perf" / "matmul_peak.json"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def measurement_conditions(device: torch.device, dtype: str) -> dict:
    """What a measured peak depends on: it is reused only when all of these match."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return {"device": name, "threads": torch.get_num_threads(), "dtype": dtype, "torch": torch.__version__}


def busy_reason() -> Optional[str]:
    """Why the machine is too busy for a trustworthy measurement right now, or None."""
    if not hasattr(os, "getloadavg"):
        return None
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > 1.25 * cores + 0.5:
        return f"the machine is busy (load average {load:.1f} on {cores} cores)"
    return None


# A measurement is trusted when its repeats agree: under contention some matmuls stall.
MAX_SCATTER = 1.25  # best / median of the timed matmuls


def measure_peak(device: torch.device, dtype: str) -> tuple[Optional[float], str]:
    """(peak FLOP/s, how it was measured) or (None, why it was refused)."""
    busy = busy_reason() if device.type == "cpu" else None
    if busy:
        return None, f"matmul peak not measured: {busy}"
    rates = time_matmuls(device.type if device.type == "cpu" else str(device), dtype, repeats=9)
    best, median = max(rates), statistics.median(rates)
    if best / median > MAX_SCATTER:
        return None, (f"matmul peak refused: timings scatter (best {best / 1e9:.1f}, median {median / 1e9:.1f} "
                      "GFLOP/s), the machine is probably busy")
    return best, f"best of 9 {dtype} 1024^3 matmuls"


def _read_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(path: Path, entries: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entries, indent=2))
    os.replace(tmp, path)


def resolve_peak(device: torch.device, dtype: str, given: Optional[float] = None) -> Peak:
    """The peak to report MFU against (see the module docstring for the order)."""
    if given:
        return Peak(float(given), "train.peak_flops")
    if device.type == "cuda":
        tf32 = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
        known = datasheet_peak(torch.cuda.get_device_name(device), dtype, tf32=tf32)
        if known is not None:
            return Peak(known[0], f"datasheet: {known[1]} dense")
    cond = measurement_conditions(device, dtype)
    key = json.dumps(cond, sort_keys=True)
    path = cache_file()
    entry = _read_cache(path).get(key)
    if entry is not None:
        return Peak(entry["flops"], f"measured {entry['when']} on {cond['device']}, {cond['threads']} threads, "
                                    f"{dtype}, torch {cond['torch']}; cached in {path}", cache_key=key)
    flops, how = measure_peak(device, dtype)
    if flops is None:
        return Peak(None, f"{how}; set train.peak_flops to report MFU")
    entries = _read_cache(path)
    entries[key] = {**cond, "flops": flops, "how": how, "when": time.strftime("%Y-%m-%d %H:%M")}
    try:
        _write_cache(path, entries)
    except OSError as e:
        log.warning("could not cache the measured matmul peak in %s: %s", path, e)
    return Peak(flops, f"measured now ({how}) on {cond['device']}, {cond['threads']} threads, {dtype}; "
                       f"cached in {path}", cache_key=key)


def forget_peak(peak: Peak) -> None:
    """Drop a cached measurement that proved wrong, so the next run measures again."""
    if peak.cache_key is None:
        return
    path = cache_file()
    entries = _read_cache(path)
    if entries.pop(peak.cache_key, None) is not None:
        _write_cache(path, entries)


class MFUMeter:
    """Model FLOP/s and MFU of a training run: MFU never exceeds 1, because a peak the run
    outpaces is not the device's peak and is dropped (with one warning) instead."""

    def __init__(self, peak: Peak, flops_per_token: float, world_size: int = 1):
        self.peak, self.flops_per_token, self.world_size = peak, flops_per_token, world_size

    def measure(self, tokens_per_s: float) -> dict:
        achieved = self.flops_per_token * tokens_per_s / self.world_size  # per device: the peak is one device's
        out = {"perf/model_flops_per_s": achieved}
        if self.peak.flops is None:
            return out
        if achieved > self.peak.flops:
            log.warning("MFU is no longer reported: the run achieves %.1f GFLOP/s per device, more than the peak "
                        "it was measured against (%s), so that peak cannot be the device's. %s",
                        achieved / 1e9, self.peak.describe(),
                        "Set train.peak_flops to the device's real peak." if self.peak.cache_key is None else
                        "The cached measurement is dropped; the next run measures again.")
            forget_peak(self.peak)
            self.peak = Peak(None, f"the peak ({self.peak.flops / 1e9:,.1f} GFLOP/s) was below the achieved rate")
            return out
        out["perf/mfu"] = achieved / self.peak.flops
        return out


def mfu(achieved_flops: float, peak_flops: float) -> float:
    """achieved / peak, refusing a ratio above 1 (the peak would be wrong, not the run superhuman)."""
    if peak_flops <= 0:
        raise ValueError(f"peak_flops={peak_flops} must be > 0")
    if achieved_flops > peak_flops:
        raise ValueError(f"achieved {achieved_flops:.3g} FLOP/s exceeds peak_flops={peak_flops:.3g}: the peak is "
                         "not this device's (MFU cannot exceed 100%)")
    return achieved_flops / peak_flops


def format_perf(perf: dict) -> str:
    """The console's throughput field: `mfu 38.0%`, or the model FLOP/s when there is no MFU."""
    if "perf/mfu" in perf:
        return f"mfu {100 * perf['perf/mfu']:.1f}%"
    return f"{perf['perf/model_flops_per_s'] / 1e9:,.1f} GFLOP/s"
