"""summary.json of the sixth run (mutX) from the raw verdicts here (`python summarize.py` in this folder).

Inputs: `run_drive_*.json` (drive.py's output: first-pass verdicts), `check_*.json` (check.py's output:
the added tests against the survivors and the mutants no test reached), `mutants.json` (every mutant
mutmut generated, by module) and EQUIVALENT in equivalent.py (each with its reason, as in README.md).

As run 4's summarize.py, plus one column: mutants of a function no test of the selection reached
(code 33) are not dropped from the score. They count in `final_all` = (killed + killed by an added
test, survivors and no-test alike) / (ran + no test - equivalent); `final` is run 4's definition
(over the mutants that ran only).
"""

from __future__ import annotations

import glob
import json
from collections import Counter

from equivalent import EQUIVALENT


def main() -> None:
    generated = json.load(open("mutants.json"))
    first: dict[str, int] = {}
    for path in sorted(glob.glob("run_drive_*.json")):
        first.update({k: v for k, v in json.load(open(path))["exit_code_by_key"].items() if v is not None})
    added: dict[str, int] = {}
    for path in sorted(glob.glob("check_*.json")):
        added.update({k: v for k, v in json.load(open(path))["exit_code_by_key"].items() if v == 1})
    out = {}
    for module, keys in generated.items():
        codes = Counter(first.get(k) for k in keys)
        ran = [k for k in keys if first.get(k) not in (None, 33)]
        no_test = [k for k in keys if first.get(k) == 33]
        killed = [k for k in ran if first[k] == 1]
        survived = [k for k in ran if first[k] in (0, -24)]
        odd = [k for k in ran if first[k] not in (0, 1, -24)]  # pytest errors, not verdicts
        equivalent = [k for k in survived + no_test if k in EQUIVALENT]
        by_test = [k for k in survived if k in added]
        no_test_by_test = [k for k in no_test if k in added]
        denom = len(ran) - len([k for k in equivalent if k in ran])
        denom_all = len(ran) + len(no_test) - len(equivalent)
        got = len(killed) + len(by_test)
        got_all = got + len(no_test_by_test)
        out[module] = dict(
            mutants=len(keys), ran=len(ran), killed=len(killed), timeout=codes[-24], survived=len(survived),
            no_test=len(no_test), not_run=codes[None], errors=len(odd), killed_by_added_test=len(by_test),
            no_test_killed_by_added_test=len(no_test_by_test), equivalent=len(equivalent),
            first_pass=f"{len(killed)}/{len(ran)}" if ran else None,
            final=f"{got}/{denom}" if denom else None,
            final_pct=round(100 * got / denom, 1) if denom else None,
            final_all=f"{got_all}/{denom_all}" if denom_all else None,
            final_all_pct=round(100 * got_all / denom_all, 1) if denom_all else None,
            survivors_killed_by_added_test=sorted(by_test), no_test_killed_by_added_test_names=sorted(no_test_by_test),
            equivalent_names=sorted(equivalent),
            not_killed=sorted(set(survived + no_test) - set(by_test) - set(no_test_by_test) - set(equivalent)),
            not_run_names=sorted(k for k in keys if first.get(k) is None), error_names=sorted(odd))
    json.dump(out, open("summary.json", "w"), indent=1, ensure_ascii=False)
    for module, row in out.items():
        print(module, {k: v for k, v in row.items() if not isinstance(v, list)})


if __name__ == "__main__":
    main()
