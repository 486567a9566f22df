"""Merge the two drivers' verdicts on moe/routing/routers/base.py into run_drive_base.json (rerun1b, mutK).

chain_mutK_c.sh drove base.py's methods and its module-level functions in two drive.py processes,
each on its own json; summarize.py reads one run_drive_base.json. Run inside `mutants/`:

    python merge_base.py run_drive_base_methods.json run_drive_base_functions.json > run_drive_base.json

`clean_before` / `clean_after` become one entry per part (a missing `clean_after`: that driver was
stopped before its end).
"""

from __future__ import annotations

import json
import sys


def main(paths: list[str]) -> None:
    out = {"parts": paths, "clean_before": {}, "clean_after": {}, "exit_code_by_key": {}, "durations_by_key": {}}
    for p in paths:
        run = json.load(open(p))
        out["clean_before"][p] = run.get("clean_before")
        out["clean_after"][p] = run.get("clean_after")
        out["exit_code_by_key"].update(run["exit_code_by_key"])
        out["durations_by_key"].update(run["durations_by_key"])
    json.dump(out, sys.stdout, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
