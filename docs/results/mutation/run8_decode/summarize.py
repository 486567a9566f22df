"""summary.json of the eighth decode-step run (mutE, README.md here): per function, from the drive runs
(run_*.json), the added tests' checks (check_*.json) and the equivalents below (reasons: README.md).
A function whose mutants did not all run is reported with its counts and `not_run`, its final over those that ran.

    python summarize.py   # in this folder
"""

import json
import os

RUNS = ["run_write.json", "run_target_probs.json", "run_model_attend.json", "run_ctx_attend_writeplan.json"]
CHECKS = ["check_write.json", "check_target_probs.json", "check_model.json", "check_ctx.json"]
FUNCTIONS = {
    "WritePlan (__init__, of)": "moe.attention.paged_torch.xǁWritePlanǁ",
    "TorchPagedAttention.plan_write": "moe.attention.paged_torch.xǁTorchPagedAttentionǁplan_write__",
    "TorchPagedAttention.write": "moe.attention.paged_torch.xǁTorchPagedAttentionǁwrite__",
    "target_probs": "moe.engine.speculative.rejection.x_target_probs__",
    "Attention._attend": "moe.model.xǁAttentionǁ_attend__",
    "PagedKVContext.attend": "moe.engine.runner.context.xǁPagedKVContextǁattend__",
    "Attention.forward": "moe.model.xǁAttentionǁforward__",
}
# mutant names (their last part) by function: equivalent (README.md gives each reason)
EQUIVALENT = {
    "TorchPagedAttention.write": ["write__mutmut_42", "write__mutmut_61"],
    "target_probs": ["x_target_probs__mutmut_69"],
    "Attention._attend": ["_attend__mutmut_12"],
}
GENERATED = json.load(open("generated.json"))  # mutants mutmut generated, by function


def main() -> None:
    first, clean = {}, {}
    for r in RUNS:
        if not os.path.exists(r):
            continue
        d = json.load(open(r))
        assert d["clean_before"] == 0 and d.get("clean_after", 0) == 0, r
        clean[r] = {"clean_before": d["clean_before"], "clean_after": d.get("clean_after")}
        first.update(d["exit_code_by_key"])
    added = {}
    for c in CHECKS:
        if not os.path.exists(c):
            continue
        d = json.load(open(c))
        assert d["clean"] == 0, c
        added.update(d["exit_code_by_key"])
    out, total = {}, {"mutants": 0, "ran": 0, "killed_first": 0, "killed_added": 0, "equivalent": 0}
    for name, prefix in FUNCTIONS.items():
        keys = [k for k in first if k.startswith(prefix)]
        n_gen = GENERATED[name]
        killed = [k for k in keys if first[k] == 1]
        survivors = [k for k in keys if first[k] != 1]
        # survivors: 0 (every test passed) or -24 (the 120 s limit, counted as a survivor, as run4 did); no
        # error and no "no test"
        assert all(first[k] in (0, -24) for k in survivors), name
        eq = [k for k in survivors if k.rsplit("ǁ", 1)[-1].rsplit(".", 1)[-1] in EQUIVALENT.get(name, [])]
        by_added = [k for k in survivors if added.get(k) == 1]
        assert not set(eq) & set(by_added), name
        left = [k for k in survivors if k not in eq and k not in by_added]
        assert all(added.get(k) == 0 for k in eq), name  # the equivalents survive the added tests too
        r = {"mutants": n_gen, "ran": len(keys), "not_run": n_gen - len(keys), "killed_first_pass": len(killed),
             "survived_first_pass": len(survivors),
             "of_which_time_limit": sum(first[k] == -24 for k in survivors), "killed_by_added_test": len(by_added), "equivalent": len(eq),
             "undecided": sorted(left), "equivalent_keys": sorted(eq), "killed_by_added_keys": sorted(by_added),
             "first_pass_pct": round(100 * len(killed) / len(keys), 1) if keys else None}
        if keys and not left:  # over the mutants that ran (PagedKVContext.attend: its write-plan lines, #50-#76)
            r["final"] = f"{len(killed) + len(by_added)}/{len(keys) - len(eq)}"
            r["final_pct"] = round(100 * (len(killed) + len(by_added)) / (len(keys) - len(eq)), 1)
        out[name] = r
        total["mutants"] += n_gen
        total["ran"] += len(keys)
        total["killed_first"] += len(killed)
        total["killed_added"] += len(by_added)
        total["equivalent"] += len(eq)
    out["total"] = total
    out["clean_runs"] = clean
    json.dump(out, open("summary.json", "w"), indent=1, ensure_ascii=False)
    for name, r in out.items():
        if name in ("total", "clean_runs"):
            continue
        fp = f"{r['killed_first_pass']}/{r['ran']} = {r['first_pass_pct']}%" if r["ran"] else "-"
        fin = f"{r['final']} = {r['final_pct']}%" if "final" in r else "-"
        print(f"| `{name}` | {r['mutants']} | {r['ran']} | {fp} | {r['survived_first_pass']} | "
              f"{r['killed_by_added_test']} | {r['equivalent']} | {r['not_run']} | {fin} |")
    print(total)


if __name__ == "__main__":
    main()
