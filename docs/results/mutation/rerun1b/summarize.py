"""Build summary.json of the re-run rerun1b (README.md here) from the driver's verdict files.

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

MODULES = {"paged_torch": "moe/attention/paged_torch.py", "block_manager": "moe/engine/memory/block_manager.py",
           "reference": "kernels/paged_attention/reference.py", "rope": "moe/rope.py",
           "base": "moe/routing/routers/base.py", "sampler": "moe/engine/sampling/sampler.py",
           "truthfulqa": "eval/tasks/truthfulqa.py"}


def functions(path: str) -> dict[str, str]:
    # (the source lines split once: ast.get_source_segment splits the whole file again at every call,
    # minutes on these mutant files of thousands of functions)
    src = open(path).read()
    lines = src.splitlines()
    out = {}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.FunctionDef) and "__mutmut_" in node.name:
            out[node.name] = "\n".join(lines[node.lineno - 1:node.end_lineno])
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
        run_path = os.path.join(folder, f"run_drive_{short}.json")
        run = json.load(open(run_path)) if os.path.exists(run_path) else {"exit_code_by_key": {}}
        codes = run["exit_code_by_key"]
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
            "survivors": {k: diff(fns, k) for k in surv},
        }
    json.dump(summary, open(os.path.join(folder, "summary.json"), "w"), indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv[1])
