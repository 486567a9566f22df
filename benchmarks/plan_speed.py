"""How long `python -m moe.engine.memory.plan` takes as a whole process (what a user waits for),
for this checkout and optionally another one (`--baseline DIR`, e.g. a worktree of an older
commit), runs interleaved A B A B so a drifting machine load hits both alike.

    python -m benchmarks.plan_speed --config benchmarks/model_configs/mixtral-8x7b --repeats 5 \
        [--baseline /path/to/old/checkout] --json out.json

Per run: wall seconds and the child's user + sys CPU seconds (`resource.getrusage`); the plan's
JSON output must be identical across runs of one checkout (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def one_run(checkout: Path, argv: list[str]) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "moe.engine.memory.plan", *argv, "--json"], cwd=checkout,
                         env=dict(os.environ, PYTHONPATH=str(checkout)), capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode not in (0, 1):  # 1 = the plan was made and the model does not fit
        raise SystemExit(f"the planner failed in {checkout}: {out.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dict(wall_s=round(wall, 3), cpu_s=round(cpu, 3), plan=json.loads(out.stdout))


def summary(runs: list[dict]) -> dict:
    out = {}
    for key in ("wall_s", "cpu_s"):
        values = sorted(r[key] for r in runs)
        out[key] = dict(median=statistics.median(values), min=values[0], max=values[-1])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="benchmarks/model_configs/mixtral-8x7b")
    ap.add_argument("--device-memory", default="141GB")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", default=None, help="another checkout to time the same way")
    ap.add_argument("--json", default=None, help="write the runs and their summary here")
    args = ap.parse_args()
    config = str(Path(args.config).resolve())
    argv = [config, "--device-memory", args.device_memory]
    checkouts = {"this": Path.cwd()} | ({"baseline": Path(args.baseline).resolve()} if args.baseline else {})
    runs: dict[str, list] = {name: [] for name in checkouts}
    for i in range(args.repeats):
        for name, path in checkouts.items():
            runs[name].append(one_run(path, argv))
            print(f"repeat {i + 1}/{args.repeats} {name}: {runs[name][-1]['wall_s']} s wall, "
                  f"{runs[name][-1]['cpu_s']} s CPU", file=sys.stderr)
    for name, rs in runs.items():
        if any(r["plan"] != rs[0]["plan"] for r in rs):
            print(f"{name}: the plan differs between runs", file=sys.stderr)
            return 1
    result = dict(config=args.config, device_memory=args.device_memory, load_before=os.getloadavg(),
                  summary={name: summary(rs) for name, rs in runs.items()}, runs=runs)
    print(json.dumps(result["summary"], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
