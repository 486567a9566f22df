"""summary.json of this run (README.md here): per module, the first pass (the modules' own tests,
drive.py: 1 killed, 0 survived, 33 no test reaches the function, -24 time limit), then each mutant's
last verdict over the added-file passes in order (drive_f.py: 2 killed, 3 survived), the pass that
killed it, and the equivalents listed in equivalent.txt (one mutant name a line).

    python summarize_s.py   (in this folder)
"""
import collections
import json
import os

MODULES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3")
FIRST = "run_first.json"
PASSES = [("run_fm.json", "test_families_mut.py (mutF)"), ("run_sm.json", "test_families_small_mut.py (added)"),
          ("run_sm2.json", "test_families_small_mut.py (added)")]
EQUIVALENT = set(open("equivalent.txt").read().split()) if os.path.exists("equivalent.txt") else set()

first = json.load(open(FIRST))["exit_code_by_key"]
verdict, by = {}, {}
for k, code in first.items():
    if code in (1, -24):
        verdict[k], by[k] = "killed", "first pass"
    else:
        verdict[k] = "survived"
for path, label in PASSES:
    if not os.path.exists(path):
        continue
    for k, code in json.load(open(path))["exit_code_by_key"].items():
        if code in (2, -24) and verdict.get(k) != "killed":
            verdict[k], by[k] = "killed", label
out = {}
for mod in MODULES:
    keys = [k for k in verdict if k.startswith(f"moe.hf.families.{mod}.")]
    killed = [k for k in keys if verdict[k] == "killed"]
    eq = [k for k in keys if k in EQUIVALENT and verdict[k] != "killed"]
    surv = [k for k in keys if verdict[k] == "survived" and k not in EQUIVALENT]
    fp = collections.Counter(first[k] for k in keys)
    out[mod] = {"mutants": len(keys), "ran": len(keys),
                "first_pass": {"killed": fp[1] + fp[-24], "survived": fp[0], "no_test": fp[33],
                               "other": sum(v for c, v in fp.items() if c not in (0, 1, 33, -24)),
                               "pct": round(100 * (fp[1] + fp[-24]) / len(keys), 1)},
                "killed": len(killed), "killed_by": dict(collections.Counter(by[k] for k in killed)),
                "equivalent": len(eq), "survived_not_equivalent": len(surv), "survivors": sorted(surv),
                "final_pct": round(100 * len(killed) / (len(keys) - len(eq)), 1)}
json.dump(out, open("summary.json", "w"), indent=1)
print(json.dumps({m: {k: v for k, v in d.items() if k != "survivors"} for m, d in out.items()}, indent=1))
