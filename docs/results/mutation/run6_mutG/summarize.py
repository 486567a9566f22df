"""summary.json of the sixth run (mutG) from the raw verdicts here (run as `python summarize.py` in this folder).

Inputs: `run_drive_*.json` (drive.py, the first pass: 1 killed, 0 survived, 33 no test of the selection
reaches the function, -24 time limit), `run_drive2_*.json` (drive2.py, for mutants the first pass did not
reach, none in the end: its files are in discarded/), `check_*.json` (check.py: the final added tests
against the survivors, 1 = fails with the mutant), `mutants.json` (every mutant mutmut generated, by
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
        second.update({k: v for k, v in json.load(open(path))["exit_code_by_key"].items()
                       if v is not None and k not in first})
    added: dict[str, int] = {}
    for path in sorted(glob.glob("check_*.json")):
        added.update(json.load(open(path))["exit_code_by_key"])
    out = {}
    for module, keys in generated.items():
        code = {k: first.get(k, second.get(k)) for k in keys}
        # 33 (no test of the selection reaches the function): it ran once the added file met it
        # (check.py, or drive2.py, whose 33 means the added file passed): a survivor of the selection
        ran = [k for k in keys if code[k] is not None and (code[k] != 33 or k in added or k in second)]
        ran1 = [k for k in ran if k in first and first[k] != 33]
        ran2 = [k for k in ran if k in second]
        killed = [k for k in ran if code[k] == 1]
        by_added_file = [k for k in ran2 if code[k] == 2]  # drive2: killed by the added file first
        survived = [k for k in ran if code[k] in (0, -24, 33)]
        by_test = [k for k in survived if added.get(k) == 1]
        equivalent = [k for k in survived if k in EQUIVALENT]
        undecided = [k for k in survived if k in UNDECIDED_ON_CPU]
        denom = len(ran) - len(equivalent)
        n_killed = len(killed) + len(by_added_file) + len(by_test)
        first_killed = sum(first[k] == 1 for k in ran1)
        out[module] = dict(
            mutants=len(keys), ran=len(ran), ran_first_pass=len(ran1), ran_drive2=len(ran2),
            killed=len(killed), killed_first_pass=first_killed,
            timeout=sum(code[k] == -24 for k in ran), survived=len(survived),
            no_test_in_selection=sum(code[k] == 33 for k in keys), not_run=len(keys) - len(ran),
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
                                           for k in keys if k not in ran)))
    json.dump(out, open("summary.json", "w"), indent=1, ensure_ascii=False)
    for module, row in out.items():
        print(module, {k: v for k, v in row.items() if not isinstance(v, (list, dict))})


if __name__ == "__main__":
    main()
