"""Tables of this record from its JSON: python docs/results/generate/dec_1204/summarize.py"""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent


def runs(prefix):
    return {side: [json.loads(p.read_text()) for p in sorted(HERE.glob(f"{prefix}_{side}_*.json"))]
            for side in ("before", "after")}


def med(xs):
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f}, n={len(xs)})" if xs else "-"


def decode_profile():
    print("| batch | code | HF step / engine step | engine paged attention / engine step | engine step ms | HF step ms |")
    print("|---|---|---|---|---|---|")
    for b in ("1", "8", "64"):
        for side, ds in runs("dp").items():
            r = [d["batches"][b] for d in ds]
            ratio = [x["hf_over_engine_step"] for x in r]
            paged = [x["engine_us"]["forward/attention/paged"] / x["engine_us"]["step"] for x in r]
            print(f"| {b} | {side} | {med(ratio)} | {med(paged)} | {med([x['engine_us']['step'] / 1e3 for x in r])} "
                  f"| {med([x['hf_us']['step'] / 1e3 for x in r])} |")


LABELS = {"engine_vs_hf_sequential_cpu": "engine vs HF, CPU time", "engine_vs_hf_sequential_wall": "engine vs HF, wall",
          "engine_vs_hf_batched_8_cpu": "vs HF batches of 8, CPU", "engine_vs_hf_batched_8_wall": "vs HF batches of 8, wall",
          "engine_vs_hf_batched_cpu": "vs HF one batch, CPU", "engine_vs_hf_batched_wall": "vs HF one batch, wall"}


def generate(prefix, keys):
    print("| code | " + " | ".join(LABELS[k] for k in keys) + " | engine CPU s |")
    print("|---|" + "---|" * (len(keys) + 1))
    for side, ds in runs(prefix).items():
        cells = [med([d[k] for d in ds if k in d]) for k in keys]
        print(f"| {side} | " + " | ".join(cells) + f" | {med([d['engine_cpu_s'] for d in ds])} |")


def attention():
    ds = [json.loads(p.read_text()) for p in sorted(HERE.glob("attn_*.json"))]
    print("| batch | before us / layer call | after us / layer call | before / after |")
    print("|---|---|---|---|")
    for b in ds[0]["batches"] if ds else []:
        r = [d["batches"][b] for d in ds]
        print(f"| {b} | {med([x['before']['median_us'] for x in r])} | {med([x['after']['median_us'] for x in r])} "
              f"| {med([x['before_over_after'] for x in r])} |")


def compiled():
    for p in sorted(HERE.glob("b1c_*.json")):
        d = json.loads(p.read_text())
        print(p.name, {k: round(v, 3) for k, v in d.items() if isinstance(v, float)},
              "compile_s", sum(d.get("compiled_first_step_s", {}).values()))


if __name__ == "__main__":
    attention()
    print()
    compiled()
    print()
    decode_profile()
    print()
    generate("b1", ["engine_vs_hf_sequential_cpu", "engine_vs_hf_sequential_wall"])
    print()
    generate("p32", ["engine_vs_hf_batched_8_cpu", "engine_vs_hf_batched_8_wall", "engine_vs_hf_batched_cpu",
                     "engine_vs_hf_batched_wall"])
