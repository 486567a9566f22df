"""Peak host memory of `train.init_from`'s load (the trainer's path: `read_model_source`, then
`initial_model`: built on meta, filled shard by shard, in fp32 master weights), on a generated HF
directory, in the style of benchmarks/load.py (a fresh interpreter, everything imported and a tiny
checkpoint loaded first, then the peak-RSS counter reset).

    python -m benchmarks.init_from_load                       # ~250 MB bf16 OLMoE -> fp32 (2x the bytes)
    python -m benchmarks.init_from_load --size-mb 120 --dtype fp32 --family qwen3_moe
    python -m benchmarks.init_from_load --size-mb 150 --repeats 3 --json run.json   # the record's form

`--repeats N` loads the same directory in N fresh interpreters (the table shows the median, the
min and max); `--json` writes every run with its CPU time and the load average (never overwrites).

Reported: peak RSS over the baseline, as a ratio to the stored weights and to the fp32 model the
trainer must hold (a bf16 source doubles in memory: the fp32 master weights are the floor).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.load import _reset_peak, _status_kb, make_synthetic_checkpoint, weights_bytes  # noqa: E402
from moe.dtypes import resolve_dtype  # noqa: E402
from moe.loading import read_model_source  # noqa: E402
from moe.train.init_from import initial_model  # noqa: E402


def _load(directory) -> torch.nn.Module:
    source = read_model_source(directory)
    return initial_model(source.model, source, torch.device("cpu"))


def worker(directory: str) -> dict:
    model_type = json.loads((Path(directory) / "config.json").read_text())["model_type"]
    with tempfile.TemporaryDirectory() as tmp:
        _load(make_synthetic_checkpoint(Path(tmp) / "warmup", size_mb=0, model_type=model_type, tiny=True))
    gc.collect()
    reset = _reset_peak()
    baseline = _status_kb("VmRSS" if reset else "VmHWM") * 1024
    t0 = time.perf_counter()
    model = _load(directory)
    seconds = time.perf_counter() - t0
    peak = _status_kb("VmHWM") * 1024
    fp32_bytes = sum(t.numel() * 4 for t in model.state_dict().values() if t.is_floating_point())
    return {"seconds": seconds, "peak_rss_bytes": peak - baseline, "peak_reset": reset, "fp32_model_bytes": fp32_bytes,
            "dtype": str(next(model.parameters()).dtype)}


def child_cpu_seconds() -> float:
    """User + system CPU seconds of this process's finished children (the workers)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(directory: Path) -> dict:
    """One load in a fresh interpreter, with its CPU time and the load average after it."""
    cpu0 = child_cpu_seconds()
    p = subprocess.run([sys.executable, "-m", "benchmarks.init_from_load", "--worker", str(directory)], cwd=REPO,
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r.update(worker_cpu_s=child_cpu_seconds() - cpu0, load_after=os.getloadavg())
    return r


def spread(runs: list, key: str, scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    """'median (min-max)' of runs[key] / scale, or the single value."""
    v = [r[key] / scale for r in runs]
    m = fmt.format(statistics.median(v))
    return m if len(v) == 1 else f"{m} ({fmt.format(min(v))}-{fmt.format(max(v))})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=250)
    ap.add_argument("--shard-mb", type=float, default=40)
    ap.add_argument("--family", default="olmoe")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--repeats", type=int, default=1, help="fresh-interpreter loads of the same directory (>= 1)")
    ap.add_argument("--json", default=None, help="write every run and the machine's load here; must not exist")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return 0
    if args.repeats < 1 or (args.json and Path(args.json).exists()):
        print(f"--repeats must be >= 1 (got {args.repeats})" if args.repeats < 1 else
              f"--json: {args.json} exists; choose a new path (this command never overwrites)", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        d = make_synthetic_checkpoint(Path(tmp) / "hf", size_mb=args.size_mb, shard_mb=args.shard_mb,
                                      model_type=args.family, dtype=resolve_dtype(args.dtype), random=False)
        stored = weights_bytes(d)
        try:
            runs = [measure(d) for _ in range(args.repeats)]
        except RuntimeError as e:
            print(e, file=sys.stderr)
            return 1
    for r in runs:
        r.update(stored_bytes=stored, family=args.family, stored_dtype=args.dtype, peak_over_stored=r["peak_rss_bytes"] / stored,
                 peak_over_fp32_model=r["peak_rss_bytes"] / r["fp32_model_bytes"])
        print(json.dumps(r))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "torch": torch.__version__, "cpus": os.cpu_count(),
                                               "load_before": load_before, "runs": runs}, indent=1) + "\n")
    print(f"| family | stored | stored MB | fp32 model MB | peak RSS MB | peak / stored | peak / fp32 model | seconds |\n"
          f"|---|---|---|---|---|---|---|---|\n| {args.family} | {args.dtype} | {stored / 1e6:.0f} | "
          f"{runs[0]['fp32_model_bytes'] / 1e6:.0f} | {spread(runs, 'peak_rss_bytes', 1e6, '{:.0f}')} | "
          f"{spread(runs, 'peak_over_stored')} | {spread(runs, 'peak_over_fp32_model')} | {spread(runs, 'seconds')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
