"""The fifth run's second phase (README.md here): drive.py with the added test file run FIRST.

Used for the mutants the first pass had not reached when the shared machine's load left too little
time for it (a survivor costs the whole selection, ~11-20 s; the added file, ~2 s). Per mutant: the
added file (`ADDED`) with the mutant on; if it fails: code 2 (killed by an added test; whether the
first-pass selection alone kills it is not measured). Else the first-pass tests as drive.py runs
them: 1 killed by them, 0 survived both, -24 the time limit. `clean_before` runs the added file and
the first-pass tests with no mutant (0: both passed).

    cd mutants && python drive2.py OUT.json tests/engine/speculative/test_decoder_mut.py PREFIX ...
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import time

from drive import LIMIT_S, _alarm, _Timeout, run_tests


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
    all_tests = sorted({t for k in keys for t in tests_by_fn.get(k.rsplit("__mutmut_", 1)[0], [])})
    if os.path.exists(out_path):
        result = json.load(open(out_path))
    else:
        result = {"added": added, "clean_before": max(run_tests([added], ""), run_tests(all_tests, "")),
                  "exit_code_by_key": {}, "durations_by_key": {}}
    signal.signal(signal.SIGALRM, _alarm)
    skip = set(os.environ.get("DRIVE2_SKIP", "").split(",")) - {""}
    for k in keys:
        if k in result["exit_code_by_key"] or k in skip:
            continue
        t0 = time.perf_counter()
        tests = sorted(tests_by_fn.get(k.rsplit("__mutmut_", 1)[0], []), key=lambda t: dur.get(t, 0.0))
        code = verdict([added], k)
        if code == 1:
            code = 2
        elif code == 0:
            code = verdict(tests, k) if tests else 33
        result["exit_code_by_key"][k] = code
        result["durations_by_key"][k] = round(time.perf_counter() - t0, 2)
        json.dump(result, open(out_path, "w"), indent=1)
        print(code, k, file=sys.stderr, flush=True)
    json.dump(result, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
