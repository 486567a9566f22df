"""Peak host memory of `train.init_from`'s load (the trainer's path: `read_model_source`, then
`initial_model`: built on meta, filled shard by shard, in fp32 master weights), on a generated HF
directory, in the style of benchmarks/load.py (a fresh interpreter, everything imported and a tiny
checkpoint loaded first, then the peak-RSS counter reset).

    python -m benchmarks.init_from_load                       # ~250 MB bf16 OLMoE -> fp32 (2x the bytes)
    python -m benchmarks.init_from_load --size-mb 120 --dtype fp32 --family qwen3_moe

Reported: peak RSS over the baseline, as a ratio to the stored weights and to the fp32 model the
trainer must hold (a bf16 source doubles in memory: the fp32 master weights are the floor).
"""

from __future__ import annotations

import argparse
import gc
import json
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=250)
    ap.add_argument("--shard-mb", type=float, default=40)
    ap.add_argument("--family", default="olmoe")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        d = make_synthetic_checkpoint(Path(tmp) / "hf", size_mb=args.size_mb, shard_mb=args.shard_mb,
                                      model_type=args.family, dtype=resolve_dtype(args.dtype), random=False)
        stored = weights_bytes(d)
        p = subprocess.run([sys.executable, "-m", "benchmarks.init_from_load", "--worker", str(d)], cwd=REPO,
                           capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            print(p.stderr[-3000:], file=sys.stderr)
            return 1
        r = json.loads(p.stdout.strip().splitlines()[-1])
    r.update(stored_bytes=stored, family=args.family, stored_dtype=args.dtype,
             peak_over_stored=r["peak_rss_bytes"] / stored, peak_over_fp32_model=r["peak_rss_bytes"] / r["fp32_model_bytes"])
    print(json.dumps(r))
    print(f"| family | stored | stored MB | fp32 model MB | peak RSS MB | peak / stored | peak / fp32 model | seconds |\n"
          f"|---|---|---|---|---|---|---|---|\n| {args.family} | {args.dtype} | {stored / 1e6:.0f} | "
          f"{r['fp32_model_bytes'] / 1e6:.0f} | {r['peak_rss_bytes'] / 1e6:.0f} | {r['peak_over_stored']:.2f} | "
          f"{r['peak_over_fp32_model']:.2f} | {r['seconds']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
