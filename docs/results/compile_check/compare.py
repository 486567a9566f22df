"""Compare two `kernels.compile_check --json` files compile by compile (issue 29 item 7: triton 3.8.0 vs 3.9.0,
or two passes of one Triton). A compile is keyed by kernel, constexprs, warps, stages and its order of
appearance among equal keys; the verdict fields compared are shared bytes, registers, stack (spill) bytes,
tensor-core instruction and error. Seconds and cubin size are not verdicts and are ignored.

    python docs/results/compile_check/compare.py A.json B.json
"""
import json
import sys
from collections import Counter

FIELDS = ("shared_bytes", "registers", "stack_bytes", "tensor_cores", "error")


def keyed(path):
    d = json.load(open(path))
    seen, out = Counter(), {}
    for k in d["kernels"]:
        base = (k["kernel"], json.dumps(k["constexprs"], sort_keys=True), k["num_warps"], k["num_stages"])
        seen[base] += 1
        out[base + (seen[base],)] = k
    return d, out


def main(a_path, b_path):
    a, ka = keyed(a_path)
    b, kb = keyed(b_path)
    print(f"A {a_path}: sm_{a['arch']}, {len(ka)} compiles, {a['spills']} spilling, {len(a['problems'])} problems")
    print(f"B {b_path}: sm_{b['arch']}, {len(kb)} compiles, {b['spills']} spilling, {len(b['problems'])} problems")
    only_a, only_b = sorted(set(ka) - set(kb)), sorted(set(kb) - set(ka))
    print(f"compiles only in A: {len(only_a)}, only in B: {len(only_b)}")
    diffs = Counter()
    lines = []
    for key in sorted(set(ka) & set(kb)):
        x, y = ka[key], kb[key]
        changed = [f for f in FIELDS if x[f] != y[f]]
        for f in changed:
            diffs[f] += 1
        if changed:
            lines.append(f"  {key[0]} {key[1]} warps={key[2]} stages={key[3]}: "
                         + ", ".join(f"{f} {x[f]} -> {y[f]}" for f in changed))
    same = len(set(ka) & set(kb)) - len(lines)
    print(f"common compiles: {len(set(ka) & set(kb))}, identical verdicts: {same}, differing: {len(lines)}"
          + (f" ({dict(diffs)})" if diffs else ""))
    print("\n".join(lines))


if __name__ == "__main__":
    main(*sys.argv[1:3])
