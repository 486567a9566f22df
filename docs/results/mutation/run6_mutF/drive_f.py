"""This run's driver (README.md here): drive3.py's added-file pass alone, without mutmut's stats.

mutmut was stopped once it had generated the mutants (before its stats run), so there is no
`mutmut-stats.json`; every mutant whose key starts with a PREFIX is run against the added test file
only (drive3.run_added: test functions called directly, stop at the first exception). Codes: 2 killed
by the added file, -24 the time limit, 3 survived it (the first-pass tests were not run).
`clean_before` / `clean_after`: the added file with no mutant (0: passed).

    cd mutants && python drive_f.py OUT.json tests/hf/test_families_mut.py PREFIX ...
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import time

from drive import LIMIT_S, _alarm, _Timeout
from drive3 import cases, run_added


def main(out_path: str, added: str, prefixes: list[str]) -> None:
    keys = []
    for meta in sorted(glob.glob("**/*.py.meta", recursive=True)):
        keys += [k for k in json.load(open(meta))["exit_code_by_key"] if k.startswith(tuple(prefixes))]
    if os.environ.get("DRIVE_KEYS"):
        only = set(open(os.environ["DRIVE_KEYS"]).read().split())
        keys = [k for k in keys if k in only]
    tests = cases(added)
    if os.path.exists(out_path):
        result = json.load(open(out_path))
    else:
        clean, why = run_added(tests, "")
        result = {"added": added, "added_cases": len(tests), "clean_before": clean, "why": why,
                  "exit_code_by_key": {}, "durations_by_key": {}, "killed_by": {}}
    signal.signal(signal.SIGALRM, _alarm)
    for k in keys:
        if k in result["exit_code_by_key"]:
            continue
        t0 = time.perf_counter()
        signal.alarm(LIMIT_S)
        try:
            code, why = run_added(tests, k)
        except _Timeout:
            code, why = -24, "time limit"
        signal.alarm(0)
        if code == 1:
            code = 2
        elif code == 0:
            code = 3
        if why:
            result["killed_by"][k] = why
        result["exit_code_by_key"][k] = code
        result["durations_by_key"][k] = round(time.perf_counter() - t0, 2)
        json.dump(result, open(out_path, "w"), indent=1)
        print(code, k, file=sys.stderr, flush=True)
    result["clean_after"] = run_added(tests, "")[0]
    os.environ["MUTANT_UNDER_TEST"] = ""
    json.dump(result, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
