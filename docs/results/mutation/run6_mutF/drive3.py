"""The sixth run's driver (README.md here): drive2.py with the added test file called directly.

At load 14-16 on the shared 2-core machine one `pytest.main` call cost 12-20 s of wall time before
its first test ran, whether the test then failed in 0.1 s or not. The added files of this run use
no fixtures, so their test functions are called here directly (each `pytest.mark.parametrize` case
expanded by hand, file order, stop at the first exception): an exception is a failing test, exactly
as pytest would count it. Per mutant: the added file with the mutant on; an exception: code 2 (killed
by an added test; whether the first-pass selection alone kills it is not measured). Else the
first-pass tests as drive.py runs them (pytest): 1 killed by them, 0 survived both, -24 the time
limit (in either), 33 no test of the selection; with DRIVE3_NO_FIRST_PASS=1 a survivor of the added
file gets code 3 (first-pass tests not run: at load 15 they cost 1-2 minutes a mutant), for a later
`DRIVE3_KEYS` run or drive.py. `clean_before`: the added file and the first-pass tests with no
mutant (0: both passed).

    cd mutants && python drive3.py OUT.json tests/hf/test_tensor_map_mut.py PREFIX ...
    cd mutants && DRIVE3_KEYS=survivors.txt python drive3.py OUT.json tests/hf/test_hf_mxfp4_mut.py PREFIX ...
"""

from __future__ import annotations

import glob
import importlib.util
import inspect
import itertools
import json
import os
import signal
import sys
import time

from drive import LIMIT_S, _alarm, _Timeout, run_tests


def cases(path: str):
    """(name, function, kwargs) for every test case of the file, in file order."""
    spec = importlib.util.spec_from_file_location("added_" + os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = []
    for name, fn in inspect.getmembers(mod, inspect.isfunction):
        if not name.startswith("test_") or fn.__module__ != mod.__name__:
            continue
        grids = []
        for mark in getattr(fn, "pytestmark", []):
            if mark.name == "parametrize":
                names = [n.strip() for n in mark.args[0].split(",")] if isinstance(mark.args[0], str) else mark.args[0]
                grids.append([dict(zip(names, v if len(names) > 1 else (v,))) for v in mark.args[1]])
        for combo in itertools.product(*grids):
            kw = {k: v for d in combo for k, v in d.items()}
            out.append((fn.__code__.co_firstlineno, name, fn, kw))
    return [(f"{n}{kw}", fn, kw) for _, n, fn, kw in sorted(out, key=lambda c: c[0])]


def run_added(tests, mutant: str) -> tuple[int, str]:
    os.environ["MUTANT_UNDER_TEST"] = mutant
    for name, fn, kw in tests:
        try:
            fn(**kw)
        except _Timeout:
            raise
        except BaseException as e:  # noqa: BLE001 - any exception fails the test, as under pytest
            return 1, f"{name}: {type(e).__name__}"
    return 0, ""


def main(out_path: str, added: str, prefixes: list[str]) -> None:
    stats = json.load(open("mutmut-stats.json"))
    tests_by_fn, dur = stats["tests_by_mangled_function_name"], stats["duration_by_test"]
    keys = []
    for meta in sorted(glob.glob("**/*.py.meta", recursive=True)):
        keys += [k for k in json.load(open(meta))["exit_code_by_key"] if k.startswith(tuple(prefixes))]
    if os.environ.get("DRIVE3_KEYS"):  # only these mutants (a file, one name a line): the first pass's survivors
        only = set(open(os.environ["DRIVE3_KEYS"]).read().split())
        keys = [k for k in keys if k in only]
    all_tests = sorted({t for k in keys for t in tests_by_fn.get(k.rsplit("__mutmut_", 1)[0], [])})
    tests = cases(added)
    if os.path.exists(out_path):
        result = json.load(open(out_path))
    else:
        clean, why = run_added(tests, "")
        result = {"added": added, "added_cases": len(tests), "clean_before_added": clean, "why": why,
                  "clean_before": run_tests(all_tests, ""), "exit_code_by_key": {}, "durations_by_key": {},
                  "killed_by": {}}
    signal.signal(signal.SIGALRM, _alarm)
    for k in keys:
        if k in result["exit_code_by_key"]:
            continue
        t0 = time.perf_counter()
        signal.alarm(LIMIT_S)
        try:
            code, why = run_added(tests, k)
        except _Timeout:  # a mutant that loops in the added file: the limit, as drive.py counts it
            code, why = -24, "time limit"
        signal.alarm(0)
        if code == -24:
            result["killed_by"][k] = why
        elif code == 1:
            code = 2
            result["killed_by"][k] = why
        elif os.environ.get("DRIVE3_NO_FIRST_PASS"):  # survivors of the added file left for a later first pass
            code = 3
        else:
            sel = sorted(tests_by_fn.get(k.rsplit("__mutmut_", 1)[0], []), key=lambda t: dur.get(t, 0.0))
            if not sel:
                code = 33
            else:
                signal.alarm(LIMIT_S)
                try:
                    code = run_tests(sel, k)
                except _Timeout:
                    code = -24
                signal.alarm(0)
                code = {0: 0, 1: 1, -24: -24}.get(code, 100 + code)
        result["exit_code_by_key"][k] = code
        result["durations_by_key"][k] = round(time.perf_counter() - t0, 2)
        json.dump(result, open(out_path, "w"), indent=1)
        print(code, k, file=sys.stderr, flush=True)
    os.environ["MUTANT_UNDER_TEST"] = ""
    json.dump(result, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
