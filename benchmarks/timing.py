"""The one per-call timer of the kernel benchmarks (paged attention, quantized GEMMs)."""

from __future__ import annotations

import time
from typing import Callable

import torch


def median_seconds(fn: Callable[[], object], device: torch.device, warmup: int, iters: int) -> float:
    """Median seconds per call of `fn` after `warmup` calls: CUDA events on a GPU (the kernel's
    device time, no host sync inside the timed region but the end event), wall clock elsewhere."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]
