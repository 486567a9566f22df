"""summary.json of this run: per module, every mutant's last verdict over the passes in order
(README.md here, steps 2-4), the pass that killed it, and the equivalents of EQUIVALENT.

    python summarize_f.py   (in this folder)
"""
import collections
import json

PASSES = [("run_base.json", "families_mut"), ("run_go_ds.json", "families_mut"),
          ("run_base_b.json", "families_mut"), ("run_go_ds_b.json", "families_mut"),
          ("run_base_c.json", "families_mut"), ("run_go_ds_mx.json", "hf_mxfp4_mut (run6_mutH)"),
          ("run_go_ds_tm.json", "tensor_map_mut (run6_mutH)"), ("run_final.json", "families_mut"),
          ("run_final2.json", "families_mut")]
EQUIVALENT = set(open("final_surv2.txt").read().split())

verdict, by = {}, {}
for path, label in PASSES:
    for k, code in json.load(open(path))["exit_code_by_key"].items():
        if code in (2, -24):
            verdict[k], by[k] = "killed", label
        elif verdict.get(k) != "killed":
            verdict[k] = "survived"
out = {}
for mod in ("base", "gpt_oss", "deepseek_v2"):
    keys = [k for k in verdict if k.startswith(f"moe.hf.families.{mod}.")]
    killed = [k for k in keys if verdict[k] == "killed"]
    eq = [k for k in keys if k in EQUIVALENT]
    surv = [k for k in keys if verdict[k] == "survived" and k not in EQUIVALENT]
    out[mod] = {"mutants": len(keys), "ran": len(keys), "killed": len(killed),
                "killed_by": dict(collections.Counter(by[k] for k in killed)), "equivalent": len(eq),
                "survived_not_equivalent": len(surv),
                "final_pct": round(100 * len(killed) / (len(keys) - len(eq)), 1)}
json.dump(out, open("summary.json", "w"), indent=1)
print(json.dumps(out, indent=1))
