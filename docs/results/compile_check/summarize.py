"""Per-kernel table of a `kernels.compile_check --json` file (IEEE=True: the fp32 specialisations)."""
import json, sys
from collections import defaultdict

d = json.load(open(sys.argv[1]))
lim = d["shared_limit"]
by = defaultdict(list)
for k in d["kernels"]:
    by[k["kernel"]].append(k)
print(f"sm_{d['arch']}: {len(d['kernels'])} compiles, {sum(1 for k in d['kernels'] if k['error'])} failed, "
      f"{d['spills']} spilling, shared limit {lim} B")
print("| kernel | compiles | max shared KiB (16-bit / fp32) | max registers (16-bit) | spilling configs (16-bit / fp32) | over the shared limit |")
print("|---|---|---|---|---|---|")
for name, ks in by.items():
    h = [k for k in ks if not k["constexprs"].get("IEEE")]
    f = [k for k in ks if k["constexprs"].get("IEEE")]
    ms = lambda xs: (max(x["shared_bytes"] for x in xs) // 1024) if xs else "-"
    mr = max((x["registers"] for x in h), default="-")
    sp = lambda xs: sum(1 for x in xs if x["stack_bytes"])
    over = sum(1 for x in ks if x["shared_bytes"] > lim)
    print(f"| `{name}` | {len(ks)} | {ms(h)} / {ms(f)} | {mr} | {sp(h)} / {sp(f)} | {over} |")
