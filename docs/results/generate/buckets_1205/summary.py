"""The README's tables from this record's JSON: the step-level runs (median (min-max) of 3 rounds) and the
32-prompt workload (each invocation's ratio of medians, then the median and range of the three invocations).
Run from anywhere: python docs/results/generate/buckets_1205/summary.py"""
import json
import statistics
from pathlib import Path

R = Path(__file__).resolve().parent


def span(xs, nd=3):
    return f"**{statistics.median(xs):.{nd}f}x** ({min(xs):.{nd}f}-{max(xs):.{nd}f})"


print("| run | tree | model | B | eager ms | compiled ms | compiled / eager (wall) | (CPU time) | eager / matmul floor |"
      " compiled outputs differing |")
print("|---|---|---|---|---|---|---|---|---|---|")
for stem, tree in (("floor_new", "new"), ("floor_old", "old"), ("floor_max64", "new, bound 64")):
    rec = json.loads((R / f"{stem}.json").read_text())
    for row in rec["rows"]:
        g = lambda k: f'{row[k]["median"]:.2f} ({row[k]["min"]:.2f}-{row[k]["max"]:.2f})'
        print(f"| {stem} | {tree} {rec['commit'][:7]} | {row['model']} | {row['batch']} | {g('eager_ms')} "
              f"| {g('compiled_ms')} | {g('compiled_over_eager')} | {g('compiled_over_eager_cpu')} "
              f"| {g('eager_over_matmul_floor')} | {row['wrong_outputs']} |")

RATIOS = [("engine_vs_hf_batched_8", "eager engine / HF static batches of 8"),
          ("compiled_engine_vs_hf_batched_8", "compiled engine / HF static batches of 8"),
          ("engine_vs_hf_batched", "eager engine / HF one padded batch"),
          ("compiled_engine_vs_hf_batched", "compiled engine / HF one padded batch"),
          (None, "compiled / eager engine")]
print("\n| 32 prompts, 2 threads | tree | wall: median of 3 invocations (range) | CPU time | outputs identical |")
print("|---|---|---|---|---|")
for model in ("tiny", "small"):
    for tree in ("new", "old"):
        recs = [json.loads((R / f"p32_{model}_{tree}_{i}.json").read_text()) for i in (1, 2, 3)]
        for key, what in RATIOS:
            if key is None:
                wall = [r["engine_s"] / r["compiled_s"] for r in recs]
                cpu = [r["engine_cpu_s"] / r["compiled_cpu_s"] for r in recs]
                same = [r["compiled_identical"] for r in recs]
            else:
                wall, cpu = [r[f"{key}_wall"] for r in recs], [r[f"{key}_cpu"] for r in recs]
                same = [r[f"{key.split('_vs_')[1]}_identical"] for r in recs]
            print(f"| {model}: {what} | {tree} | {span(wall)}: "
                  f"{', '.join(f'{x:.3f}' for x in wall)} | {span(cpu)} | {same} |")
        first = [r["compiled_first_step_s"] for r in recs]
        print(f"| {model}: graphs, and their first steps (compile) in all | {tree} | {len(first[0])} graphs: "
              f"{', '.join(f'{sum(f.values()):.1f}' for f in first)} s | | |")
