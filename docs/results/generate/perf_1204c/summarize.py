"""Tables of a record from its JSON: python docs/results/generate/perf_1204c/summarize.py [<record folder>]
(default: this folder; docs/results/generate/quiet_1204c is the other record made by run.sh)."""
import json
import statistics
import sys
from pathlib import Path

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent


def med(xs, f="{:.2f}"):
    return f"{f.format(statistics.median(xs))} ({f.format(min(xs))}-{f.format(max(xs))}, n={len(xs)})" if xs else "-"


def load(prefix):
    return [json.loads(p.read_text()) for p in sorted(HERE.glob(f"{prefix}_[0-9].json"))]


def generate():
    b1, p32 = load("b1"), load("p32")
    print("| comparison | engine vs HF by CPU time, median (min-max) | the same by wall clock |")
    print("|---|---|---|")
    for name, ds, key in (("batch 1 vs HF sequential", b1, "engine_vs_hf_sequential"),
                          ("32 prompts vs HF static batches of 8", p32, "engine_vs_hf_batched_8"),
                          ("32 prompts vs HF one padded batch", p32, "engine_vs_hf_batched")):
        print(f"| {name} | {med([d[key + '_cpu'] for d in ds])} | {med([d[key + '_wall'] for d in ds])} |")


def decode_profile():
    ds = load("dp")
    print("| batch | engine step ms | HF step ms | HF / engine | engine attention ms (of which paged) | HF attention ms |")
    print("|---|---|---|---|---|---|")
    for b in ("1", "8", "64"):
        r = [d["batches"][b] for d in ds]
        e = lambda k: [x["engine_us"][k] / 1e3 for x in r]  # noqa: E731
        h = lambda k: [x["hf_us"][k] / 1e3 for x in r]  # noqa: E731
        print(f"| {b} | {med(e('step'))} | {med(h('step'))} | {med([x['hf_over_engine_step'] for x in r])} "
              f"| {med(e('forward/attention'))} ({med(e('forward/attention/paged'))}) | {med(h('forward/attention'))} |")


def ab():
    for name in ("engine_ab.json", "attention_ab.json"):
        p = HERE / name
        if p.exists():
            print(name, json.dumps(json.loads(p.read_text()), indent=None)[:2000])


if __name__ == "__main__":
    generate()
    print()
    decode_profile()
