"""Check added tests against named survivors, by hand as the third run did (README.md here).

Inside the run's `mutants/` (the added test files copied into mutants/tests/ first):

    python check.py OUT.json tests/quant/test_schemes_mut.py -- <mutant name> ...

For each mutant: the added tests run with it switched on (MUTANT_UNDER_TEST) and must fail (code 1:
killed by the added test, 0: still survives); the same tests run with no mutant first and must pass.
"""

from __future__ import annotations

import json
import sys

from drive import run_tests


def main(out_path: str, tests: list[str], mutants: list[str]) -> None:
    result = {"tests": tests, "clean": run_tests(tests, ""), "exit_code_by_key": {}}
    for k in mutants:
        result["exit_code_by_key"][k] = {0: 0, 1: 1}.get(run_tests(tests, k), "error")
        json.dump(result, open(out_path, "w"), indent=1)
    json.dump(result, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    sep = sys.argv.index("--")
    main(sys.argv[1], sys.argv[2:sep], sys.argv[sep + 1:])
