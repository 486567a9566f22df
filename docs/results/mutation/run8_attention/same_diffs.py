"""Check that this run's regenerated mutants are rerun1_partial's: for every mutant of the two
modules, the diff (summarize.py's `diff`) is compared with rerun1_partial/summary.json's where that
record has one (its survivors), and the mutant counts with its counts. Run in `mutants/`:

    python same_diffs.py <path of rerun1_partial>   # writes same_diffs.json here
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, sys.argv[1])
from summarize import diff, functions  # noqa: E402

old = json.load(open(os.path.join(sys.argv[1], "summary.json")))
out = {}
for path in ["moe/attention/sdpa.py", "moe/attention/eager.py"]:
    meta = json.load(open(path + ".meta"))["exit_code_by_key"]
    fns = functions(path)
    surv = old[path]["survivors"]
    same = {k: diff(fns, k) == d for k, d in surv.items()}
    out[path] = {"mutants_now": len(meta), "mutants_rerun1": old[path]["mutants"],
                 "rerun1_survivors": len(surv), "same_diff": sum(same.values()),
                 "differ": [k for k, v in same.items() if not v]}
json.dump(out, open("same_diffs.json", "w"), indent=1, ensure_ascii=False)
print(json.dumps(out, indent=1, ensure_ascii=False))
