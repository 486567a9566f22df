"""Device selection and the matmul peak that MFU is measured against."""

from __future__ import annotations

import functools
import time

import torch

from moe.config import ConfigError


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name!r} but CUDA is not available here; use 'cpu' or 'auto'")
    return dev


@functools.lru_cache(maxsize=None)
def measure_matmul_peak(device: str = "cpu", dtype: str = "fp32", n: int = 1024, repeats: int = 5) -> float:
    """Best achieved FLOP/s of an n x n x n matmul on `device`: the practical ceiling that
    MFU is reported against when the user gives no `train.peak_flops` (datasheet peaks are
    unreachable on CPUs and vary with clocks)."""
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    dev = torch.device(device)
    if dev.type == "cuda":
        n = max(n, 8192)
    # A private generator: measuring must not consume the training RNG stream (a resumed run
    # measures again and would otherwise draw different jitter noise than an uninterrupted one).
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=dt, generator=gen)
    b = torch.randn(n, n, device=dev, dtype=dt, generator=gen)
    best = float("inf")
    for i in range(repeats + 1):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t = time.perf_counter()
        a @ b
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if i:  # the first call warms up
            best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best
