"""The one per-call timer of the kernel benchmarks (paged attention, quantized GEMMs, MLA), and the
one way they end: record written, wrong outputs named, exit status 1 if any."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
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


def finish_record(record: dict, json_path, wrong: list) -> int:
    """The load after the run into `record`, `record` to `json_path` (if given), each wrong output on
    stderr; 1 if any output was wrong (a benchmark that sees one exits non-zero), else 0."""
    record["load_after"] = os.getloadavg()
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(record, indent=1) + "\n")
    for w in wrong:
        print("WRONG OUTPUT:", w, file=sys.stderr)
    return 1 if wrong else 0
