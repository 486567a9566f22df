"""The README's tables from this record's JSON: the floor runs (median (min-max) of 3 rounds) and issue 32's
generate ratios (each invocation's ratio of medians, then the median and range of the three invocations).
Run from anywhere: python docs/results/generate/floor_1205/summary.py"""
import json
import statistics
from pathlib import Path

R = Path(__file__).resolve().parent


def span(xs, nd=2):
    return f"**{statistics.median(xs):.{nd}f}x** ({min(xs):.{nd}f}-{max(xs):.{nd}f})"


print("| threads | tree | model | B | weights MB | eager ms | compiled ms | matmul floor ms | compiled / eager (wall) "
      "| (CPU time) | eager / floor | compiled / floor |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for t in (1, 2):
    for tree in ("new", "old"):
        rec = json.loads((R / f"floor_t{t}_{tree}.json").read_text())
        for row in rec["rows"]:
            g = lambda k: f'{row[k]["median"]:.2f} ({row[k]["min"]:.2f}-{row[k]["max"]:.2f})'
            print(f"| {t} | {tree} {rec['commit'][:7]} | {row['model']} | {row['batch']} | {row['weight_mb_per_step']} "
                  f"| {g('eager_ms')} | {g('compiled_ms')} | {g('matmul_floor_ms')} | {g('compiled_over_eager')} "
                  f"| {g('compiled_over_eager_cpu')} | {g('eager_over_matmul_floor')} | {g('compiled_over_matmul_floor')} |")

RATIOS = {  # (file stem, JSON key, what)
    "small_b1_t2": [("compiled_engine_vs_hf_sequential", "`small` batch 1: compiled engine / HF generate()"),
                    ("engine_vs_hf_sequential", "`small` batch 1: eager engine / HF generate()"),
                    (("engine", "compiled"), "`small` batch 1: compiled / eager engine")],
    "tiny_b1_t2": [("compiled_engine_vs_hf_sequential", "tiny batch 1: compiled engine / HF generate()"),
                   ("engine_vs_hf_sequential", "tiny batch 1: eager engine / HF generate()"),
                   (("engine", "compiled"), "tiny batch 1: compiled / eager engine")],
    "tiny_b8_t2": [(("engine", "compiled"), "tiny, at most 8 (16 prompts): compiled / eager engine")],
    "small_b8_t2": [(("engine", "compiled"), "`small`, at most 8 (16 prompts): compiled / eager engine")],
    "small_p32_t2": [("engine_vs_hf_batched_8", "`small`, 32 prompts: engine / HF static batches of 8"),
                     ("engine_vs_hf_batched", "`small`, 32 prompts: engine / HF one padded batch")],
    "p32_t2": [("engine_vs_hf_batched_8", "tiny, 32 prompts: engine / HF static batches of 8"),
               ("engine_vs_hf_batched", "tiny, 32 prompts: engine / HF one padded batch")],
}
print("\n| issue 32 ratio (2 threads) | wall: median of 3 invocations (range) | CPU time | outputs identical |")
print("|---|---|---|---|")
for stem, items in RATIOS.items():
    recs = [json.loads((R / f"{stem}{s}.json").read_text()) for s in ("", "_2", "_3")]
    for key, what in items:
        if isinstance(key, tuple):
            wall = [r[f"{key[0]}_s"] / r[f"{key[1]}_s"] for r in recs]
            cpu = [r[f"{key[0]}_cpu_s"] / r[f"{key[1]}_cpu_s"] for r in recs]
            same = [r["compiled_identical"] for r in recs]
        else:
            wall, cpu = [r[f"{key}_wall"] for r in recs], [r[f"{key}_cpu"] for r in recs]
            peer = key.split("_vs_")[1]
            same = [r.get(f"{peer}_identical") for r in recs]
        print(f"| {what} | {span(wall, 3)}: {', '.join(f'{x:.3f}' for x in wall)} | {span(cpu, 3)} | {same} |")
