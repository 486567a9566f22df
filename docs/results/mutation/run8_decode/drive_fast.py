"""run8_decode: the fourth run's drive.py (../run4_features/drive.py) with one change, `FIRST`: a mutant's
tests run in two pytest calls, its FIRST fastest tests, then (only if they all pass) the rest, so a
mutant killed early does not pay for collecting every test file. The verdict is the same (killed
when any test fails, survived when all pass). The fourth run's description follows.

Run mutmut's mutants in ONE Python process (the fourth run's driver; see README.md here).

mutmut 3.8.1 runs every mutant in a fresh forked process that imports torch and starts pytest;
on the shared 2-core machine at load 20-28 that was 3-6 mutants a minute. mutmut's trampolines
read MUTANT_UNDER_TEST on every call, so the same verdicts come from one process that sets the
variable and calls pytest.main on the tests mutmut's own stats run found reaching the mutated
function (mutants/mutmut-stats.json), fastest first, stopping at the first failure (`-x`).

Run inside a `mutants/` directory that `mutmut run` generated (and whose stats it recorded):

    cd mutants && python drive.py OUT.json "moe.quant.schemes.int8" ...   # module prefixes

Codes as mutmut's .meta: 1 killed, 0 survived, 33 no test of the selection reaches the function,
-24 killed by the per-mutant time limit (LIMIT_S). Not valid for tests that leave state behind
that a mutant could change (module caches); the modules run here are checked by a clean run
before and after (`clean` in the output must be 0 both times).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import time

import pytest

LIMIT_S = 120
FIRST = 10


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout(f"mutant ran past {LIMIT_S} s")


def run_tests(tests: list[str], mutant: str) -> int:
    os.environ["MUTANT_UNDER_TEST"] = mutant
    args = ["-x", "-q", "-p", "no:cacheprovider", "-m", "not slow", "--rootdir=.", "-W", "ignore", *tests]
    return int(pytest.main(args))


def main(out_path: str, prefixes: list[str]) -> None:
    stats = json.load(open("mutmut-stats.json"))
    tests_by_fn, dur = stats["tests_by_mangled_function_name"], stats["duration_by_test"]
    keys = []
    for meta in sorted(glob.glob("**/*.py.meta", recursive=True)):
        keys += [k for k in json.load(open(meta))["exit_code_by_key"] if k.startswith(tuple(prefixes))]
    all_tests = sorted({t for k in keys for t in tests_by_fn.get(k.rsplit("__mutmut_", 1)[0], [])})
    if os.path.exists(out_path):  # a stopped run goes on where it stopped
        result = json.load(open(out_path))
    else:
        result = {"clean_before": run_tests(all_tests, ""), "exit_code_by_key": {}, "durations_by_key": {}}
    signal.signal(signal.SIGALRM, _alarm)
    for k in keys:
        if k in result["exit_code_by_key"]:
            continue
        tests = sorted(tests_by_fn.get(k.rsplit("__mutmut_", 1)[0], []), key=lambda t: dur.get(t, 0.0))
        t0 = time.perf_counter()
        if not tests:
            code = 33
        else:
            signal.alarm(LIMIT_S)
            try:
                code = run_tests(tests[:FIRST], k)
                if code == 0 and len(tests) > FIRST:
                    code = run_tests(tests[FIRST:], k)
            except _Timeout:  # raised outside a test (pytest's own code): the limit all the same
                code = -24
            signal.alarm(0)
            # pytest: 0 passed, 1 a test failed; anything else (usage error, nothing collected) is
            # not a verdict and is kept as 100 + code for a look by hand
            code = -24 if time.perf_counter() - t0 >= LIMIT_S else {0: 0, 1: 1}.get(code, 100 + code)
        result["exit_code_by_key"][k] = code
        result["durations_by_key"][k] = round(time.perf_counter() - t0, 2)
        json.dump(result, open(out_path, "w"), indent=1)
        print(code, k, file=sys.stderr, flush=True)
    result["clean_after"] = run_tests(all_tests, "")
    json.dump(result, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
