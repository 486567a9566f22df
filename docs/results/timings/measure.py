"""The single timings the guides quote in passing, each command timed N times, interleaved.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python docs/results/timings/measure.py --repeats 3 --out docs/results/timings/timings.json

Per run: wall seconds, CPU seconds of the child (user + sys, from getrusage), exit status, the
load average before and after. Rounds run every command once, in order, so a load change hits
them alike. The profiling ranges' per-call costs (a flag read, a bare `record_function`) are
timed in-process with timeit (the median of 7 blocks of 20,000 calls each, per round), by the wall
clock and by the process's CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path

import torch

COMMANDS = {
    # docs/guides/testing.md: "the Triton paged kernel under the interpreter (slow, ~18 s)"
    "triton_paged_kernel_test": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=1",
                                 "tests/engine/core/test_logprob_parity.py", "-k", "test_triton_paged_kernel"],
    # docs/guides/quantization.md: "Tests (CPU, TRITON_INTERPRET=1; about 20 s together ...)"
    "quant_gemm_tests": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels/quant_gemm/"],
    # docs/guides/quantization.md: "importing torchao takes about 8 s"; its peer: importing torch alone
    "import_torch": [sys.executable, "-c", "import torch"],
    "import_torchao": [sys.executable, "-c", "import torchao"],
    # docs/guides/lm_eval.md: "the ~15 s index of the harness's 14,000 tasks"
    "lm_eval_task_index": [sys.executable, "-c", "from lm_eval.tasks import TaskManager; "
                           "tm = TaskManager(); print(len(tm.all_tasks), 'tasks')"],
}


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(name: str, cmd: list) -> dict:
    load_before, cpu0, t0 = os.getloadavg(), child_cpu(), time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="1"))
    return {"name": name, "wall_s": time.perf_counter() - t0, "cpu_s": child_cpu() - cpu0, "rc": p.returncode,
            "load_before": load_before, "load_after": os.getloadavg(), "stdout_tail": p.stdout[-600:]}


def range_costs() -> dict:
    """Per-call microseconds of the flag read `stage` does and of a bare `record_function` (no profiler)."""
    from torch.autograd import _profiler_enabled
    from torch.profiler import record_function

    def bare():
        with record_function("routing"):
            pass

    n, out = 20_000, {"name": "profiling_range_costs"}
    # wall clock (timeit's default) and CPU time: on a loaded machine the wall time mostly waits for a core
    for suffix, timer in (("", time.perf_counter), ("_cpu", time.process_time)):
        out["flag_read_us" + suffix] = statistics.median(timeit.repeat(_profiler_enabled, number=n, repeat=7, timer=timer)) / n * 1e6
        out["record_function_us" + suffix] = statistics.median(timeit.repeat(bare, number=n, repeat=7, timer=timer)) / n * 1e6
    return dict(out, load_after=os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if Path(args.out).exists():
        print(f"--out: {args.out} exists; choose a new path", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    runs = []
    for r in range(args.repeats):
        for name, cmd in COMMANDS.items():
            runs.append(dict(run(name, cmd), round=r))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "stdout_tail"}), flush=True)
        runs.append(dict(range_costs(), round=r))
        print(json.dumps(runs[-1]), flush=True)
    record = {"commands": {k: " ".join(v[1:]) for k, v in COMMANDS.items()}, "runs": runs,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
