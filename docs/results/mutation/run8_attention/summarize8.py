"""Build summary.json of run8_attention (README.md here) from the first pass (drive.py) and the
added tests' check (check.py). Run inside the `mutants/` directory mutmut generated, with this folder
as the argument:

    cd mutants && python summarize8.py <record folder>

A mutant's final verdict: killed by the first pass (code 1), else killed by the added tests in
check_added.json (code 1), else equivalent when listed in equivalent.txt, else survived.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), "rerun1_partial"))
from summarize import diff, functions  # noqa: E402  (rerun1_partial's diff of a mutant)

MODULES = {"sdpa": "moe/attention/sdpa.py", "eager": "moe/attention/eager.py"}


def main(folder: str) -> None:
    added = json.load(open(os.path.join(folder, "check_added.json")))
    assert added["clean"] == 0
    equivalent = {l.split()[0]: l.split(None, 1)[1].strip() for l in open(os.path.join(folder, "equivalent.txt"))
                  if l.strip() and not l.startswith("#")}
    summary = {}
    for short, path in MODULES.items():
        meta = json.load(open(path + ".meta"))["exit_code_by_key"]
        run = json.load(open(os.path.join(folder, f"run_drive_{short}.json")))
        codes = run["exit_code_by_key"]
        fns = functions(path)
        ran = [k for k in meta if k in codes]
        surv = [k for k in ran if codes[k] != 1]
        by_added = [k for k in surv if added["exit_code_by_key"].get(k) == 1]
        equiv = [k for k in surv if k not in by_added and k in equivalent]
        left = [k for k in surv if k not in by_added and k not in equivalent]
        killed = len(ran) - len(surv) + len(by_added)
        summary[path] = {
            "mutants": len(meta), "ran": len(ran), "first_pass_killed": len(ran) - len(surv),
            "first_pass_survived": sum(codes[k] == 0 for k in ran), "timeout": sum(codes[k] == -24 for k in ran),
            "no_test": sum(codes[k] == 33 for k in ran), "other": sum(codes[k] not in (0, 1, 33, -24) for k in ran),
            "not_run": len(meta) - len(ran), "clean_before": run.get("clean_before"), "clean_after": run.get("clean_after"),
            "killed_by_added_tests": len(by_added), "equivalent": len(equiv), "survived_not_equivalent": len(left),
            "final_killed_of_non_equivalent": f"{killed}/{len(ran) - len(equiv)}",
            "survivors": {k: {"diff": diff(fns, k), "added_tests": added["exit_code_by_key"].get(k),
                              "equivalent": equivalent.get(k)} for k in surv},
        }
    json.dump(summary, open(os.path.join(folder, "summary.json"), "w"), indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv[1])
