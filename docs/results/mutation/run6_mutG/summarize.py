"""summary.json of the sixth run (mutG) from the raw verdicts here (run as `python summarize.py` in this folder).

Inputs: `run_drive_*.json` (drive.py, the first pass: 1 killed, 0 survived, 33 no test, -24 time limit),
`run_drive2_*.json` (drive2.py, for mutants the first pass did not reach: 2 killed by the added file,
1 killed by the first-pass tests, 0 survived both), `check_*.json` (check.py: the added tests against
first-pass survivors, 1 = fails with the mutant), `mutants.json` (every mutant mutmut generated, by
module), and EQUIVALENT / UNDECIDED_ON_CPU below (the reasons: README.md here).
A mutant has at most one verdict: the first pass's if it ran there, else drive2's.
"""

from __future__ import annotations

import glob
import json
from collections import Counter

from equivalents import EQUIVALENT, UNDECIDED_ON_CPU


def main() -> None:
    generated = json.load(open("mutants.json"))
    first: dict[str, int] = {}
    for path in sorted(glob.glob("run_drive_*.json")):
        first.update({k: v for k, v in json.load(open(path))["exit_code_by_key"].items() if v is not None})
    second: dict[str, int] = {}
    for path in sorted(glob.glob("run_drive2_*.json")):
        # drive2's 33: the added file ran and passed, and no test of the selection reaches the
        # function: a survivor of the tests that ran (0), not a mutant without a test
        second.update({k: (0 if v == 33 else v) for k, v in json.load(open(path))["exit_code_by_key"].items()
                       if v is not None and k not in first})
    added: dict[str, int] = {}
    for path in sorted(glob.glob("check_*.json")):
        added.update({k: v for k, v in json.load(open(path))["exit_code_by_key"].items() if v == 1})
    out = {}
    for module, keys in generated.items():
        code = {k: first.get(k, second.get(k)) for k in keys}
        ran1 = [k for k in keys if k in first and first[k] != 33]
        ran2 = [k for k in keys if k in second and second[k] != 33]
        ran = ran1 + ran2
        killed = [k for k in ran if code[k] == 1]
        by_added_file = [k for k in ran2 if code[k] == 2]  # drive2: killed by the added file first
        survived = [k for k in ran if code[k] in (0, -24)]
        by_test = [k for k in survived if k in added]
        equivalent = [k for k in survived if k in EQUIVALENT]
        undecided = [k for k in survived if k in UNDECIDED_ON_CPU]
        denom = len(ran) - len(equivalent)
        n_killed = len(killed) + len(by_added_file) + len(by_test)
        first_killed = sum(first[k] == 1 for k in ran1)
        out[module] = dict(
            mutants=len(keys), ran=len(ran), ran_first_pass=len(ran1), ran_drive2=len(ran2),
            killed=len(killed), killed_first_pass=first_killed,
            timeout=sum(code[k] == -24 for k in ran), survived=len(survived),
            no_test=sum(code[k] == 33 for k in keys), not_run=sum(code[k] is None for k in keys),
            killed_by_added_file_in_drive2=len(by_added_file), killed_by_added_test=len(by_test),
            equivalent=len(equivalent), undecided_on_cpu=len(undecided),
            final=f"{n_killed}/{denom}" if denom else None,
            final_pct=round(100 * n_killed / denom, 1) if denom else None,
            first_pass=f"{first_killed}/{len(ran1)}" if ran1 else None,
            first_pass_pct=round(100 * first_killed / len(ran1), 1) if ran1 else None,
            survivors_killed_by_added_test=sorted(by_test), equivalent_names=sorted(equivalent),
            undecided_on_cpu_names=sorted(undecided),
            not_killed=sorted(set(survived) - set(by_test) - set(equivalent)),
            not_run_functions=dict(Counter(k.rsplit("__mutmut_", 1)[0].split(".")[-1]
                                           for k in keys if code[k] is None)))
    json.dump(out, open("summary.json", "w"), indent=1, ensure_ascii=False)
    for module, row in out.items():
        print(module, {k: v for k, v in row.items() if not isinstance(v, (list, dict))})


if __name__ == "__main__":
    main()
