"""Peak host memory of loading one rank of a tensor-parallel engine (issue 35, sharded reading).

    PYTHONPATH=$PWD python -m benchmarks.engine_tp_load --out docs/results/engine_tp_load/cpu.json --repeats 3

Writes a random moe-lab checkpoint (fp32, `--d-model` etc.), then loads it in a fresh process per
measurement, interleaved: `full` (`moe.loading.load_model`, what every rank did before) and rank 0
of 2 with TP or EP experts (`moe.engine.parallel.shard_load.load_shard`). Each child reports its
resident set after imports, its peak (VmHWM) after loading, the bytes of what it loaded and read,
wall and CPU seconds. Peak minus baseline is what the loading cost; for the sharded modes also the
resident set when the meta-device shard is built, just before its tensors are read (peak minus
that is what reading the slices cost).
"""

from __future__ import annotations

import argparse
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

from moe.checkpoint import save_checkpoint
from moe.config import Config, ModelConfig, to_dict
from moe.engine.parallel import shard_load
from moe.engine.parallel.comm import RankGroup
from moe.engine.parallel.shard_load import load_shard, open_source
from moe.loading import load_model
from moe.model import Transformer
from moe.routing.routers import router_config
from tests.conftest import with_variants

MODES = ("full", "tp2", "ep2")


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def child(mode: str, path: str) -> dict:
    torch.set_num_threads(1)
    base = _status_kib("VmRSS")
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    read, stages = None, {}
    if mode == "full":
        model = load_model(path)[0]
    else:
        fill = shard_load.fill_shard

        def timed_fill(*a, **k):  # the resident set once the meta shard is built: what filling it adds is apart
            stages["before_fill_rss_mib"] = _status_kib("VmRSS") / 1024
            stages["before_fill_peak_mib"] = _status_kib("VmHWM") / 1024
            fill(*a, **k)

        shard_load.fill_shard = timed_fill
        source = open_source(path)
        model = load_shard(path, RankGroup(0, 2, torch.device("cpu")), mode == "ep2", "cpu", None, source=source)[0]
        read = source.bytes_read
        del source
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    held = sum(t.numel() * t.element_size() for t in {id(t): t for t in model.state_dict().values()}.values())
    return {"mode": mode, "baseline_rss_mib": base / 1024, "peak_rss_mib": _status_kib("VmHWM") / 1024,
            "loaded_mib": held / 2**20, "read_mib": None if read is None else read / 2**20, "wall_s": wall,
            "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), **stages}


def make_checkpoint(directory: Path, args) -> Path:
    torch.manual_seed(0)
    cfg = with_variants(ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.n_layers, n_heads=8,
                                    n_kv_heads=4, n_experts=args.n_experts, expert_hidden=args.expert_hidden,
                                    max_seq_len=256), router_config(top_k=2))
    model = Transformer(cfg)
    return save_checkpoint(directory / "step_0000001.pt",
                           {"model": model.state_dict(), "config": to_dict(Config(model=model.cfg))})


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-experts", type=int, default=8)
    p.add_argument("--expert-hidden", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    runs = []
    with tempfile.TemporaryDirectory() as d:
        path = make_checkpoint(Path(d), args)
        size = path.stat().st_size / 2**20
        for rep in range(args.repeats):
            for mode in MODES:  # interleaved: each mode sees the same load over the session
                out = subprocess.run([sys.executable, "-m", "benchmarks.engine_tp_load", "--out", "-", "--child",
                                      mode, str(path)], capture_output=True, text=True, check=True,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})
                run = json.loads(out.stdout.strip().splitlines()[-1])
                run.update(repeat=rep, load=os.getloadavg())
                runs.append(run)
                print(json.dumps(run), flush=True)
    summary = {}
    for mode in MODES:
        cost = [r["peak_rss_mib"] - r["baseline_rss_mib"] for r in runs if r["mode"] == mode]
        fill = [r["peak_rss_mib"] - r["before_fill_rss_mib"] for r in runs if r["mode"] == mode
                and "before_fill_rss_mib" in r]
        summary[mode] = {"peak_minus_baseline_mib": {"median": statistics.median(cost), "min": min(cost),
                                                     "max": max(cost)},
                         "peak_minus_before_fill_mib": {"median": statistics.median(fill), "min": min(fill),
                                                        "max": max(fill)} if fill else None,
                         "loaded_mib": next(r["loaded_mib"] for r in runs if r["mode"] == mode)}
    result = {"checkpoint_mib": size, "model": vars(args) | {"child": None}, "runs": runs, "summary": summary,
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True).stdout.strip(), "machine": os.uname().nodename,
              "cpus": os.cpu_count()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
