"""The tables of README.md from the raw JSON: `python docs/results/speculative/summarize.py code.json prose.json`,
and with `--across code.json code_2.json code_3.json` one table over repeated invocations of one corpus.

Per side: median (min-max) of the timed runs' wall and process CPU seconds; the speed-up against the
plain engine is the ratio of the medians (what the benchmark prints), with the min-max of the
ratios of the runs paired by repeat index (run i of the side against run i of the plain engine).
"""
import json
import statistics
import sys
from pathlib import Path


def spread(xs):
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def table(path: Path) -> str:
    spec = json.loads(path.read_text())["speculative"]
    plain = spec["engine, plain"]["runs"]
    lines = [f"{path.name}: batch {spec['batch']}",
             "| run | wall s | CPU s | tok/s (wall) | vs plain, wall | vs plain, CPU | speculation | outputs identical to the plain engine |",
             "|---|---|---|---|---|---|---|---|"]
    for name, side in spec.items():
        if not isinstance(side, dict):
            continue
        runs = side["runs"]
        walls, cpus = [r["wall_s"] for r in runs], [r["cpu_s"] for r in runs]
        rw = [p["wall_s"] / r["wall_s"] for p, r in zip(plain, runs)]
        rc = [p["cpu_s"] / r["cpu_s"] for p, r in zip(plain, runs)]
        acc = ""
        if "acceptance_rate" in side:
            acc = (f"acceptance {side['acceptance_rate']:.2f} (first draft {side['first_acceptance_rate']:.2f}), "
                   f"{side['mean_accepted_length']:.2f} accepted/step")
        lines.append(f"| {name} | {spread(walls)} | {spread(cpus)} | {side['tok_s']:.0f} | "
                     f"**{side['vs_plain_wall']:.2f}x** ({min(rw):.2f}-{max(rw):.2f}) | "
                     f"**{side['vs_plain_cpu']:.2f}x** ({min(rc):.2f}-{max(rc):.2f}) | {acc} | "
                     f"{side['identical']} |")
    return "\n".join(lines)


def across(paths: list[Path]) -> str:
    """Per side: each invocation's median-based speed-ups, then their median (min-max) over the invocations."""
    specs = [json.loads(p.read_text())["speculative"] for p in paths]
    names = [n for n, side in specs[0].items() if isinstance(side, dict)]
    lines = [" + ".join(p.name for p in paths),
             "| run | tok/s (wall), per invocation | vs plain, wall: median (min-max) | vs plain, CPU: median (min-max) "
             "| per invocation (wall / CPU) | acceptance, per invocation |",
             "|---|---|---|---|---|---|"]
    for name in names:
        sides = [sp[name] for sp in specs]
        rw, rc = [s["vs_plain_wall"] for s in sides], [s["vs_plain_cpu"] for s in sides]
        acc = ", ".join(f"{s['acceptance_rate']:.2f}" for s in sides) if "acceptance_rate" in sides[0] else ""
        tok_s = ", ".join(f"{s['tok_s']:.0f}" for s in sides)
        lines.append(f"| {name} | {tok_s} | "
                     f"**{statistics.median(rw):.2f}x** ({min(rw):.2f}-{max(rw):.2f}) | "
                     f"**{statistics.median(rc):.2f}x** ({min(rc):.2f}-{max(rc):.2f}) | "
                     f"{'; '.join(f'{a:.2f} / {b:.2f}' for a, b in zip(rw, rc))} | {acc} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "--across":
        print(across([Path(p) for p in sys.argv[2:]]))
    else:
        print("\n\n".join(table(Path(p)) for p in sys.argv[1:]))
