"""check.py (../run4_features/check.py) with drive.py's time limit, for a mutant that hangs (rerun1b, mutK).

Inside the run's `mutants/`:

    python check_limit.py OUT.json LIMIT_S <tests> -- <mutant name> ...

For each mutant the tests run with it switched on under a SIGALRM of LIMIT_S seconds: 1 a test
failed, 0 all passed, -24 the limit was reached (mutmut's code for a mutant its timeout killed);
the same tests run with no mutant first (`clean`, must be 0). `max_rss_kb` is the process's peak
resident memory after each (ru_maxrss), to show what the hang did.
"""

from __future__ import annotations

import json
import resource
import signal
import sys
import time

from drive import run_tests


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout("past the limit")


def main(out_path: str, limit: int, tests: list[str], mutants: list[str]) -> None:
    result = {"tests": tests, "limit_s": limit, "clean": run_tests(tests, ""), "exit_code_by_key": {},
              "durations_by_key": {}, "max_rss_kb": {}}
    signal.signal(signal.SIGALRM, _alarm)
    for k in mutants:
        t0 = time.perf_counter()
        signal.alarm(limit)
        try:
            code = run_tests(tests, k)
        except _Timeout:
            code = -24
        signal.alarm(0)
        dt = time.perf_counter() - t0
        result["exit_code_by_key"][k] = -24 if dt >= limit else {0: 0, 1: 1}.get(code, "error")
        result["durations_by_key"][k] = round(dt, 2)
        result["max_rss_kb"][k] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        json.dump(result, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    sep = sys.argv.index("--")
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:sep], sys.argv[sep + 1:])
