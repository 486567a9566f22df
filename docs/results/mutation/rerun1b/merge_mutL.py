"""Merge the verdict files of drivers that ran side by side on one module (mutL; README.md here).

    cd mutants && python merge_mutL.py run_drive_sampler.json run_drive_sampler_a.json run_drive_sampler_b.json ...

Each part ran drive.py on its own functions of the module (chain_mutL.sh, chain_mutL_b2.sh). A key
two parts ran keeps the first part's verdict; every such key is listed under `duplicates` with
both verdicts. The merged file holds every verdict and duration, `clean_before` /
`clean_after` as the worst (largest) of the parts' (absent if a part has none), and each part's
own under `parts`.
"""

from __future__ import annotations

import json
import sys


def main(out: str, parts: list[str]) -> None:
    merged = {"exit_code_by_key": {}, "durations_by_key": {}, "parts": {}}
    for p in parts:
        r = json.load(open(p))
        for k, v in r["exit_code_by_key"].items():
            if k in merged["exit_code_by_key"]:
                merged.setdefault("duplicates", {})[k] = [merged["exit_code_by_key"][k], v]
                continue
            merged["exit_code_by_key"][k] = v
            merged["durations_by_key"][k] = r["durations_by_key"][k]
        merged["parts"][p] = {"clean_before": r.get("clean_before"), "clean_after": r.get("clean_after"),
                              "verdicts": len(r["exit_code_by_key"])}
    for c in ("clean_before", "clean_after"):
        vals = [v[c] for v in merged["parts"].values()]
        if all(v is not None for v in vals):
            merged[c] = max(vals)
    json.dump(merged, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
