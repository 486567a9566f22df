"""summary.json of the fourth run from the raw verdicts here (run as `python summarize.py` in this folder).

Inputs: `run_*.json` (drive.py's output: first-pass verdicts), `check_*.json` (check.py's output: the
added tests against the survivors), `mutants.json` (every mutant mutmut generated, by module) and
EQUIVALENT below (survivors argued equivalent in README.md, with the reason there).
"""

from __future__ import annotations

import glob
import json
from collections import Counter

EQUIVALENT = {
    # |w / scale| <= 448 * (1 + 2**-22) for finite w, which rounds to +-448 in any round-to-nearest
    # E4M3 cast (464 is the midpoint to the next, non-existent, value): the clamp never acts
    "moe.quant.schemes.fp8_weight.xǁFP8Weightǁquantize__mutmut_16",
    "moe.quant.schemes.fp8_weight.xǁFP8Weightǁquantize__mutmut_17",
    "moe.quant.schemes.fp8_weight.xǁFP8Weightǁquantize__mutmut_19",
    # the same for int8: |w / scale| <= 127 * (1 + 2**-22) rounds to 127, so clamp(-127, 127) never acts
    "moe.quant.schemes.int8.xǁInt8ǁquantize__mutmut_16",
    "moe.quant.schemes.int8.xǁInt8ǁquantize__mutmut_17",
    "moe.quant.schemes.int8.xǁInt8ǁquantize__mutmut_19",
    "moe.quant.schemes.int8.xǁInt8ǁquantize__mutmut_23",  # clamp(-128, 127)
    "moe.quant.schemes.int8.xǁInt8ǁquantize__mutmut_24",  # clamp(-127, 128)
    # `n_groups / g != I` is true whenever the pad is 0 too, and padding by 0 is a copy of w
    "moe.quant.schemes.int4.xǁInt4ǁquantize__mutmut_5",
    # zero = round(-lo / scale) with lo <= 0 and scale >= -lo / 15: always in [0, 15 * (1 + 2**-22)],
    # so dropping either bound of its clamp(0, 15) changes nothing (round(-0.0) casts to 0 as well)
    "moe.quant.schemes.int4.xǁInt4ǁquantize__mutmut_41",
    "moe.quant.schemes.int4.xǁInt4ǁquantize__mutmut_42",
    "moe.quant.schemes.int4.xǁInt4ǁquantize__mutmut_44",  # clamp(0, ): as #42
    "moe.quant.schemes.int4.xǁInt4ǁquantize__mutmut_49",  # clamp(0, 16): as #42
    # codes = round(w / scale) + zero >= round(lo / scale) + round(-lo / scale) = 0 (round is odd,
    # IEEE division is sign-symmetric): the lower bound of clamp(0, 15) never acts (the upper one does)
    "moe.quant.schemes.int4.xǁInt4ǁquantize__mutmut_52",
    # `a <= 2` for `a < 2`: at a = 2 both branches give 2 (round(4) / 2 = round(2))
    "moe.quant.schemes.mxfp4.x_round_to_e2m1__mutmut_8",
    "moe.quant.schemes.mxfp4.x_round_to_e2m1__mutmut_21",  # `a <= 4`: at 4, round(4) = round(4 / 2) * 2
    "moe.quant.schemes.mxfp4.x_shared_exponents__mutmut_6",  # `exp.to(None)`: frexp's exponent is int32 already
    # the upper bound of clamp(-127, 127) dropped: fp32 < 2^128, so floor(log2(amax)) - 2 <= 125
    "moe.quant.schemes.mxfp4.x_shared_exponents__mutmut_9",
    "moe.quant.schemes.mxfp4.x_shared_exponents__mutmut_11",
    "moe.quant.schemes.mxfp4.x_shared_exponents__mutmut_24",  # clamp(-127, 128): as #9
    "moe.quant.schemes.mxfp4.x_shared_exponents__mutmut_21",  # -128 for an all-zero block: the clamp makes it -127
}


def main() -> None:
    generated = json.load(open("mutants.json"))
    first: dict[str, int] = {}
    for path in sorted(glob.glob("run_*.json")):
        first.update({k: v for k, v in json.load(open(path))["exit_code_by_key"].items() if v is not None})
    added: dict[str, int] = {}
    for path in sorted(glob.glob("check_*.json")):
        added.update({k: v for k, v in json.load(open(path))["exit_code_by_key"].items() if v == 1})
    out = {}
    for module, keys in generated.items():
        codes = Counter(first.get(k) for k in keys)
        ran = [k for k in keys if first.get(k) not in (None, 33)]
        # a timeout here came from the machine's load (limit 120 s, load 40-50), not from a mutant
        # that loops: it counts as a survivor until a test kills it in well under the limit
        killed = [k for k in ran if first[k] == 1]
        survived = [k for k in ran if first[k] in (0, -24)]
        equivalent = [k for k in survived if k in EQUIVALENT]
        by_test = [k for k in survived if k in added]
        denom = len(ran) - len(equivalent)
        out[module] = dict(
            mutants=len(keys), ran=len(ran), killed=len(killed), timeout=codes[-24], survived=len(survived),
            no_test=codes[33], not_run=codes[None], killed_by_added_test=len(by_test), equivalent=len(equivalent),
            final=f"{len(killed) + len(by_test)}/{denom}" if denom else None,
            final_pct=round(100 * (len(killed) + len(by_test)) / denom, 1) if denom else None,
            survivors_killed_by_added_test=sorted(by_test), equivalent_names=sorted(equivalent),
            not_killed=sorted(set(survived) - set(by_test) - set(equivalent)))
    json.dump(out, open("summary.json", "w"), indent=1, ensure_ascii=False)
    for module, row in out.items():
        print(module, {k: v for k, v in row.items() if not isinstance(v, list)})


if __name__ == "__main__":
    main()
