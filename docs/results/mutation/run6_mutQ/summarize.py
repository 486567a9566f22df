"""summary.json of this run (README.md here): mutmut's verdicts (run_mutmut_*.meta.json, copies of
mutants/moe/quant/*.py.meta), the added tests' verdicts on the survivors (check_final_*.json, drive3.py's
output: 2 = killed by the added file, 0 = survives it) and the equivalents named in equivalents.txt.

    python summarize.py   # in this folder
"""

from __future__ import annotations

import glob
import json

MUTMUT = {1: "killed", 0: "survived", 33: "no test", -24: "timeout", 34: "skipped", 5: "no tests", None: "not run"}


def main() -> None:
    equivalent = {line.split()[0] for line in open("equivalents.txt") if line.strip() and not line.startswith("#")}
    added = {}
    for f in sorted(glob.glob("check_final_*.json")):
        added.update(json.load(open(f))["exit_code_by_key"])
    out = {}
    for meta in sorted(glob.glob("run_mutmut_*.meta.json")):
        codes = json.load(open(meta))["exit_code_by_key"]
        module = "moe/quant/" + meta[len("run_mutmut_"):-len(".meta.json")] + ".py"
        row = {"mutants": len(codes), "ran": 0, "killed": 0, "survived": 0, "timeout": 0, "no_test": 0,
               "not_run": 0, "killed_by_added_test": 0, "equivalent": 0, "survivors_open": []}
        for k, c in codes.items():
            if c is None:
                row["not_run"] += 1
                continue
            row["ran"] += 1
            if c in (1, -24):
                row["killed"] += 1
                row["timeout"] += c == -24
            elif c in (0, 33):
                row["survived" if c == 0 else "no_test"] += 1
                if added.get(k) in (1, 2, -24):
                    row["killed_by_added_test"] += 1
                elif k in equivalent:
                    row["equivalent"] += 1
                else:
                    row["survivors_open"].append(k)
        nonequiv = row["ran"] - row["equivalent"]
        done = row["killed"] + row["killed_by_added_test"]
        row["final"] = f"{done}/{nonequiv} = {100 * done / nonequiv:.1f}%" if nonequiv else "-"
        row["first_pass"] = f"{row['killed']}/{row['ran']} = {100 * row['killed'] / row['ran']:.1f}%" if row["ran"] else "-"
        out[module] = row
    json.dump(out, open("summary.json", "w"), indent=1)
    for m, r in out.items():
        print(m, {k: v for k, v in r.items() if k != "survivors_open"}, len(r["survivors_open"]), "open")


if __name__ == "__main__":
    main()
