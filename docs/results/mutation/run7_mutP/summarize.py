"""summary.json of the seventh run (mutP, README.md here): per function, from the drive.py runs
(run_*.json), the added tests' checks (check_*.json) and the equivalents below (reasons: README.md).

    python summarize.py   # in this folder
"""

import json

RUNS = ["run_small.json", "run_contig.json", "run_attend.json", "run_gathered.json"]
CHECKS = ["check_rows.json", "check_step.json", "check_plan.json"]
FUNCTIONS = {
    "DecodePlan (__init__, bias)": "moe.attention.paged_torch_decode.xǁDecodePlanǁ",
    "decode_gathered": "moe.attention.paged_torch_decode.x_decode_gathered__",
    "decode_contiguous": "moe.attention.paged_torch.x_decode_contiguous__",
    "contiguous_span": "moe.attention.paged_torch.x_contiguous_span__",
    "TorchPagedAttention.plan_decode": "moe.attention.paged_torch.xǁTorchPagedAttentionǁplan_decode__",
    "TorchPagedAttention.decode": "moe.attention.paged_torch.xǁTorchPagedAttentionǁdecode__",
    "row_argmax": "moe.engine.sampling.sampler.x_row_argmax__",
    "finite_rows": "moe.engine.sampling.sampler.x_finite_rows__",
    "PagedKVContext.attend": "moe.engine.runner.context.xǁPagedKVContextǁattend__",
    "one_token_experts": "moe.engine.runner.decode_experts.x_one_token_experts__",
}
# mutant number by function: equivalent (README.md gives each reason)
EQUIVALENT = {
    "DecodePlan (__init__, bias)": ["bias__mutmut_33"],
    "decode_gathered": ["x_decode_gathered__mutmut_237", "x_decode_gathered__mutmut_246"],
    "row_argmax": ["x_row_argmax__mutmut_4", "x_row_argmax__mutmut_10"],
    "finite_rows": ["x_finite_rows__mutmut_3", "x_finite_rows__mutmut_4", "x_finite_rows__mutmut_5",
                    "x_finite_rows__mutmut_11"],
    "PagedKVContext.attend": ["attend__mutmut_163"],
}


def main() -> None:
    first = {}
    for r in RUNS:
        d = json.load(open(r))
        assert d["clean_before"] == 0 and d["clean_after"] == 0, r
        first.update(d["exit_code_by_key"])
    added = {}
    for c in CHECKS:
        d = json.load(open(c))
        assert d["clean"] == 0, c
        added.update(d["exit_code_by_key"])
    out, total = {}, {"mutants": 0, "killed_first": 0, "killed_added": 0, "equivalent": 0}
    for name, prefix in FUNCTIONS.items():
        keys = [k for k in first if k.startswith(prefix)]
        killed = [k for k in keys if first[k] == 1]
        survivors = [k for k in keys if first[k] != 1]
        assert all(first[k] == 0 for k in survivors), name  # no timeout, no error, no "no test"
        eq = [k for k in survivors if any(k.endswith("." + e) or k.endswith("ǁ" + e) for e in EQUIVALENT.get(name, []))]
        by_added = [k for k in survivors if added.get(k) == 1]
        assert not set(eq) & set(by_added), name
        left = [k for k in survivors if k not in eq and k not in by_added]
        assert not left, (name, left)
        assert all(added.get(k) == 0 for k in eq), name  # the equivalents survive the added tests too
        n_eq = len(eq)
        out[name] = {"mutants": len(keys), "killed_first_pass": len(killed), "survived_first_pass": len(survivors),
                     "killed_by_added_test": len(by_added), "equivalent": n_eq,
                     "equivalent_keys": sorted(eq), "killed_by_added_keys": sorted(by_added),
                     "final": f"{len(killed) + len(by_added)}/{len(keys) - n_eq}",
                     "final_pct": round(100 * (len(killed) + len(by_added)) / (len(keys) - n_eq), 1),
                     "first_pass_pct": round(100 * len(killed) / len(keys), 1)}
        total["mutants"] += len(keys)
        total["killed_first"] += len(killed)
        total["killed_added"] += len(by_added)
        total["equivalent"] += n_eq
    out["total"] = total
    json.dump(out, open("summary.json", "w"), indent=1, ensure_ascii=False)
    for name, r in out.items():
        if name != "total":
            print(f"| `{name}` | {r['mutants']} | {r['killed_first_pass']} ({r['first_pass_pct']}%) | "
                  f"{r['killed_by_added_test']} | {r['equivalent']} | {r['final']} = {r['final_pct']}% |")
    print(total)


if __name__ == "__main__":
    main()
