"""A clean run (no mutant) of the tests a stopped driver file's mutants reached (mutM; README.md here).

drive.py records `clean_after` only when it gets to its end; a driver stopped before (its module's tail
went to another driver, or the hard stop) has none. This runs the same union of tests drive.py would
have run then, for the mutants the file holds, with MUTANT_UNDER_TEST empty, and writes the pytest code:

    cd mutants && python clean_run.py OUT.json run_drive_checkpoint.json
"""

from __future__ import annotations

import json
import sys

from drive import run_tests


def main(out_path: str, run_path: str) -> None:
    stats = json.load(open("mutmut-stats.json"))["tests_by_mangled_function_name"]
    keys = json.load(open(run_path))["exit_code_by_key"]
    tests = sorted({t for k in keys for t in stats.get(k.rsplit("__mutmut_", 1)[0], [])})
    result = {"run": run_path, "mutants": len(keys), "tests": len(tests), "clean": run_tests(tests, "")}
    json.dump(result, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
