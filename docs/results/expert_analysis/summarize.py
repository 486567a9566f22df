"""The figures docs/guides/expert_analysis.md quotes, read from this record's raw files.

    python docs/results/expert_analysis/summarize.py [record folder]   # writes summary.json there

Reads results_seed<S>_rep<R>.json (the analysis task's results.json), train_seed<S>.jsonl (the
training's metrics, trimmed), threads_t<T>_rep<R>.jsonl (threads.sh) and load.txt; checks that the seed-0 repeats agree on every number
but their timings and paths.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
VOLATILE = {"timing", "report", "plots", "load_seconds", "path", "reference", "run_dir", "ckpt"}


def stable(o):
    """results.json without its timings and paths (what must agree across repeats)."""
    if isinstance(o, dict):
        return {k: stable(v) for k, v in o.items() if k not in VOLATILE}
    if isinstance(o, list):
        return [stable(v) for v in o]
    return o


def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs), "values": xs}


def headline(r: dict) -> dict:
    dom = r["domain_specialization"]
    names = dom["domains"]
    out = {"tokens_per_domain": dom["tokens"], "layers": {}}
    for L in dom["layers"]:
        frac = L["fractions"]  # [domain][expert]
        E = len(frac[0])
        best = max(range(E), key=lambda e: L["specialization"][e])
        per_domain = {}
        for d, name in enumerate(names):
            e = max(range(E), key=lambda x: frac[d][x])
            per_domain[name] = {"expert": e, "fraction": frac[d][e],
                                "its_fraction_of": {n: frac[i][e] for i, n in enumerate(names)}}
        over_half = [{"expert": e, "domain": names[d], "fraction": frac[d][e]}
                     for d in range(len(names)) for e in range(E) if frac[d][e] > 0.5]
        out["layers"][L["layer"]] = {
            "mean_specialization": L["mean_specialization"],
            "most_specialised": {"expert": best, "domain": L["top_domain"][best], "score": L["specialization"][best]},
            "largest_fraction_per_domain": per_domain, "experts_over_half_of_a_domain": over_half}
    voc = {}
    for L in r["vocabulary"]["layers"]:
        shares = [t["share"] for ex in L["experts"] for t in ex["top_tokens"]]
        voc[L["layer"]] = {"min_top_token_share": min(shares), "top_tokens_below_1": sum(s < 1 for s in shares),
                           "top_n_fraction_min": min(ex["top_n_fraction"] for ex in L["experts"]),
                           "top_n_fraction_max": max(ex["top_n_fraction"] for ex in L["experts"])}
    out["vocabulary"] = voc
    co = {}
    for L in r["coactivation"]["layers"]:
        lift = L["lift"]
        pairs = [lift[i][j] for i in range(len(lift)) for j in range(i + 1, len(lift)) if lift[i][j] is not None]
        p = L["top_pairs"][0]
        co[L["layer"]] = {"top_pair": p["experts"], "lift": p["lift"], "conditional": p["conditional"],
                          "median_pair_lift": statistics.median(pairs)}
    out["coactivation"] = {"uniform_lift": r["coactivation"]["uniform_lift"], "layers": co}
    s = r["saturation"]
    out["saturation"] = {"layers": s["layers"], "by_step": {p["step"]: {"per_layer": p["overlap"],
                                                                        "mean": p["mean_overlap"]}
                                                            for p in s["checkpoints"]}}
    a = r["agreement"]
    out["agreement_top1"] = {"mean": a["mean_overlap"], "per_layer": [L["overlap"] for L in a["layers"]]}
    g = r["generation"]
    tvg = [(v, L["layer"], d) for L in g["layers"] for d, v in L["tv_generated_vs_real"].items()]
    out["generation"] = {"engine": g["engine"], "max_tv_engine_vs_forward": g["max_tv_engine_vs_teacher_forced"],
                         "tv_generated_vs_real_min": min(tvg)[0], "tv_generated_vs_real_max": max(tvg)[0],
                         "tv_generated_vs_real_argmax": {"layer": max(tvg)[1], "domain": max(tvg)[2]},
                         "engine_fractions_last_layer": g["layers"][-1]["engine_fractions"],
                         "generated_fractions_last_layer": g["layers"][-1]["generated_fractions"]}
    return out


def training(path: Path) -> dict:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    tps = [x["perf/tokens_per_s"] for x in rows if "perf/tokens_per_s" in x]
    return {"val_loss": {x["step"]: x["val/loss"] for x in rows if "val/loss" in x},
            "tokens_per_s_per_10_steps": spread(tps) | {"values": None}}


def main() -> None:
    out = {"analyses": {}, "training": {}}
    results = {}
    for f in sorted(HERE.glob("results_seed*_rep*.json")):
        seed, rep = map(int, re.findall(r"\d+", f.stem))
        results[(seed, rep)] = json.loads(f.read_text())
    for (seed, rep), r in results.items():
        out["analyses"][f"seed{seed}_rep{rep}"] = {"timing": r["timing"]}
    for seed in sorted({s for s, _ in results}):
        reps = sorted(rep for s, rep in results if s == seed)
        first = results[(seed, reps[0])]
        out[f"seed{seed}"] = headline(first)
        out[f"seed{seed}"]["repeats_identical_but_timing"] = all(
            stable(results[(seed, rep)]) == stable(first) for rep in reps)
        out[f"seed{seed}"]["timing"] = {k: spread([results[(seed, rep)]["timing"][k] for rep in reps])
                                        for k in ("collect_seconds", "total_seconds")}
    walls = {}
    for line in (HERE / "load.txt").read_text().splitlines():
        m = re.match(r"analysis seed(\d+) rep(\d+) end rc=0 wall_s=([\d.]+)", line)
        if m:
            walls.setdefault(int(m.group(1)), []).append(float(m.group(3)))
    for seed, w in walls.items():
        out[f"seed{seed}"]["timing"]["command_wall_seconds"] = spread(w)
    for f in sorted(HERE.glob("train_seed*.jsonl")):
        out["training"][f.stem] = training(f)
    for f in sorted(HERE.glob("train_summary_seed*.json")):
        s = json.loads(f.read_text())
        out["training"].setdefault(f.stem.replace("_summary", ""), {}).update(
            {k: s[k] for k in ("train_seconds", "wall_seconds", "final_val_loss", "final_train_loss")})
    threads = {}
    for f in sorted(HERE.glob("threads_t*_rep*.jsonl")):
        t, rep = map(int, re.findall(r"\d+", f.stem))
        tps = [json.loads(x)["perf/tokens_per_s"] for x in f.read_text().splitlines()
               if "perf/tokens_per_s" in json.loads(x)]
        threads.setdefault(f"OMP_NUM_THREADS={t}", []).append(statistics.median(tps[1:]))  # first window: warm-up
    if threads:
        out["threads_tokens_per_s_steps_11_to_20"] = {k: spread(v) for k, v in threads.items()}
    (HERE / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
