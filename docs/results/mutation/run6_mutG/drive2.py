"""The sixth run's second phase (README.md here): run5's drive2.py (run4_engine/run5_drive2.py) on this
run's drive.py: the added test file run FIRST.

Used for the guided.py functions the first pass (drive.py) could not reach before the hard stop.
Per mutant: the added file (`ADDED`, whole) with the mutant on; if it fails: code 2 (killed by an
added test; whether the first-pass selection alone kills it is not measured). Else the function's
first-pass tests as drive.py runs them (file by file, in file order, after a clean run of that list):
1 killed by them, 0 survived both, -24 the time limit. `clean_before` runs the added file with no
mutant (0: passed); `clean_by_function` as in drive.py.

    cd mutants && python drive2.py OUT.json tests/engine/sampling/test_guided_mut.py PREFIX ...
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import time

from drive import LIMIT_S, _alarm, _Timeout, order, run_tests


def verdict(tests: list[str], k: str) -> int:
    signal.alarm(LIMIT_S)
    try:
        code = run_tests(tests, k)
    except _Timeout:
        code = -24
    signal.alarm(0)
    return {0: 0, 1: 1, -24: -24}.get(code, 100 + code)


def main(out_path: str, added: str, prefixes: list[str]) -> None:
    stats = json.load(open("mutmut-stats.json"))
    tests_by_fn, dur = stats["tests_by_mangled_function_name"], stats["duration_by_test"]
    keys = []
    for meta in sorted(glob.glob("**/*.py.meta", recursive=True)):
        keys += [k for k in json.load(open(meta))["exit_code_by_key"] if k.startswith(tuple(prefixes))]
    if os.path.exists(out_path):
        result = json.load(open(out_path))
    else:
        result = {"added": added, "clean_before": run_tests([added], ""), "exit_code_by_key": {},
                  "durations_by_key": {}, "clean_by_function": {}}
    signal.signal(signal.SIGALRM, _alarm)
    clean = result["clean_by_function"]
    for k in keys:
        if k in result["exit_code_by_key"]:
            continue
        fn = k.rsplit("__mutmut_", 1)[0]
        tests = order(tests_by_fn.get(fn, []), dur)
        t0 = time.perf_counter()
        code = verdict([added], k)
        if code == 1:
            code = 2
        elif code == 0:
            if tests and fn not in clean:
                clean[fn] = run_tests(tests, "")
            if tests and clean[fn] != 0:
                continue  # no verdict against a failing clean run
            code = verdict(tests, k) if tests else 33
        result["exit_code_by_key"][k] = code
        result["durations_by_key"][k] = round(time.perf_counter() - t0, 2)
        json.dump(result, open(out_path, "w"), indent=1)
        print(code, k, file=sys.stderr, flush=True)
    json.dump(result, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
