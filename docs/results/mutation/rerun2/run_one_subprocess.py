"""One mutant in a child process under a hard kill limit (rerun2, lead, 2026-12-05 second session).

drive.py runs every mutant inside its own process with a SIGALRM limit; `page_releaser` #66 (madvise
MADV_DONTNEED over `hi + lo` bytes: past the tensor, over the process's own anonymous memory) hung that
process beyond the alarm. mutmut itself runs each mutant in a forked child and counts a child that dies
by a signal or is killed at its timeout as caught; this does the same for one mutant:

    python run_one_subprocess.py OUT.json LIMIT_S MUTANT

The tests are drive.py's selection for the mutant's function (mutmut-stats.json, fastest first, -x).
A clean child (no mutant) runs them first and must exit 0. Codes: the child's exit status (1 a test
failed = killed, 0 survived), negative = killed by that signal, -24 = the limit (SIGKILL sent at LIMIT_S).
"""
import json, subprocess, sys, time

out_path, limit, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
stats = json.load(open("mutmut-stats.json"))
dur = stats["duration_by_test"]
tests = sorted(stats["tests_by_mangled_function_name"][key.rsplit("__mutmut_", 1)[0]], key=lambda t: dur.get(t, 0.0))
child = "import sys, drive; sys.exit(drive.run_tests(sys.argv[2:], sys.argv[1]))"


def run(mutant):
    t0 = time.perf_counter()
    try:
        code = subprocess.run([sys.executable, "-c", child, mutant, *tests], timeout=limit,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    except subprocess.TimeoutExpired:  # (subprocess.run kills the child with SIGKILL)
        code = -24
    return code, round(time.perf_counter() - t0, 2)


result = {"tests": tests, "limit_s": limit}
result["clean"], result["clean_s"] = run("")
result["exit_code_by_key"], result["durations_by_key"] = {}, {}
result["exit_code_by_key"][key], result["durations_by_key"][key] = run(key)
json.dump(result, open(out_path, "w"), indent=1)
print(result)
