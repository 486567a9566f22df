"""Build summary.json of the second run's re-run (README.md here) from the driver's verdict files.

Run inside the `mutants/` directory mutmut generated (it reads each module's mutant source for the
survivors' diffs), with this folder as the argument:

    cd mutants && python summarize.py <record folder>

Codes as mutmut's .meta: 1 killed, 0 survived, 33 no test of the selection reaches the function,
-24 the driver's time limit; a missing key = not run.
"""

from __future__ import annotations

import ast
import difflib
import glob
import json
import os
import sys

MODULES = {"topk": "moe/routing/routers/topk.py", "switch": "moe/routing/routers/switch.py",
           "sinkhorn": "moe/routing/routers/sinkhorn.py", "hash": "moe/routing/routers/hash.py",
           "expert_choice": "moe/routing/routers/expert_choice.py", "aux_free": "moe/routing/routers/aux_free.py",
           "truthfulqa": "eval/tasks/truthfulqa.py", "resume": "moe/train/resume.py",
           "checkpointing": "moe/train/checkpointing.py", "checkpoint": "moe/checkpoint.py"}
# the second run took only TruthfulQA's four loading functions (the first run had the rest)
ONLY = {"eval/tasks/truthfulqa.py": ("eval.tasks.truthfulqa.x_load_docs__", "eval.tasks.truthfulqa.x__rows_from_dir__",
                                     "eval.tasks.truthfulqa.x__categories__", "eval.tasks.truthfulqa.x__targets__")}


def functions(path: str) -> dict[str, str]:
    src = open(path).read()
    out = {}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.FunctionDef) and "__mutmut_" in node.name:
            out[node.name] = ast.get_source_segment(src, node)
    return out


def diff(fns: dict[str, str], key: str) -> str:
    name = key.rsplit(".", 1)[1] if "ǁ" not in key else "xǁ" + key.split("xǁ", 1)[1]
    orig = name.rsplit("__mutmut_", 1)[0] + "__mutmut_orig"
    a = fns[orig].replace(orig, "F", 1).splitlines()
    b = fns[name].replace(name, "F", 1).splitlines()
    return "\n".join(l for l in difflib.unified_diff(a, b, lineterm="", n=0) if not l.startswith(("---", "+++", "@@")))


def main(folder: str) -> None:
    summary = {}
    for short, path in MODULES.items():
        meta = json.load(open(path + ".meta"))["exit_code_by_key"]
        if path in ONLY:
            meta = {k: v for k, v in meta.items() if k.startswith(ONLY[path])}
        run_path = os.path.join(folder, f"run_drive_{short}.json")
        run = json.load(open(run_path)) if os.path.exists(run_path) else {"exit_code_by_key": {}}
        codes = dict(run["exit_code_by_key"])
        # mutM: a module's tail runs beside it (run_drive_<module>_tail.json, _tail2.json); a tail's verdict
        # is taken where both ran a mutant
        for tail_path in sorted(glob.glob(os.path.join(folder, f"run_drive_{short}_tail*.json"))):
            tail, name = json.load(open(tail_path)), os.path.basename(tail_path)[len(f"run_drive_{short}_"):-5]
            codes.update(tail["exit_code_by_key"])
            run = {**run, f"{name}_clean_before": tail.get("clean_before"), f"{name}_clean_after": tail.get("clean_after")}
        fns = functions(path)
        ran = [k for k in meta if k in codes]
        surv = sorted((k for k in ran if codes[k] in (0, -24)), key=lambda k: (k.rsplit("__mutmut_", 1)[0],
                                                                              int(k.rsplit("_", 1)[1])))
        summary[path] = {
            "mutants": len(meta), "ran": len(ran), "killed": sum(codes[k] == 1 for k in ran),
            "survived": sum(codes[k] == 0 for k in ran), "timeout": sum(codes[k] == -24 for k in ran),
            "no_test": sum(codes[k] == 33 for k in ran), "other": sum(codes[k] not in (0, 1, 33, -24) for k in ran),
            "not_run": len(meta) - len(ran),
            "clean_before": run.get("clean_before"), "clean_after": run.get("clean_after"),
            **{k: v for k, v in run.items() if k.startswith("tail")},
            "survivors": {k: diff(fns, k) for k in surv},
        }
    json.dump(summary, open(os.path.join(folder, "summary.json"), "w"), indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv[1])
