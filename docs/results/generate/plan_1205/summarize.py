"""The table of README.md from ops_<i>.json: python docs/results/generate/plan_1205/summarize.py"""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
rows: dict = {}
for p in sorted(HERE.glob("ops_[0-9].json")):
    for x in json.loads(p.read_text())["results"]:
        rows.setdefault((x["batch"], x["pair"]), []).append(x)


def f(v):
    return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"


print("| batch | pair | old, us a call | new, us a call | old / new | the plan, made once a step, us |")
print("|---|---|---|---|---|---|")
for (b, pair), xs in sorted(rows.items()):
    old, new = [x["old"]["median"] for x in xs], [x["new"]["median"] for x in xs]
    once = [x["plan_once_us"]["median"] for x in xs if "plan_once_us" in x]
    ratio = statistics.median([a / c for a, c in zip(old, new)])
    print(f"| {b} | `{pair}` | {f(old)} | {f(new)} | {ratio:.2f}x | {f(once) if once else '-'} |")
