"""run5_summary.json of the fifth run (proposers.py, decoder.py) from the raw verdicts here
(`python run5_summarize.py` in this folder; README.md's "Fifth run" section says how each was made).

Inputs: `run5_drive_*.json` (drive.py's output: first-pass verdicts), `run5_drive2_*.json` (drive2.py's:
the second phase, the added file first), `run5_check_*.json` (check.py's output: the added tests against
the survivors), `run5_mutants.json` (every mutant mutmut generated, by module) and EQUIVALENT / UNDECIDED
below (survivors argued in README.md, with the reason there).
"""

from __future__ import annotations

import glob
import json

P = "moe.engine.speculative.proposers."
D = "moe.engine.speculative.decoder.xǁSpecDecoderǁ"
MP = P + "xǁModelProposerǁ"
EQUIVALENT: dict[str, str] = {  # mutant -> the reason (README.md); each holds on any device
    P + "xǁNgramProposerǁlookup__mutmut_12": "n from min(max_n, L + 1): for n >= L the inner loop range(L - n - 1, -1, -1) is empty",
    P + "xǁNgramProposerǁlookup__mutmut_30": "s down to -1: ids[-1:n - 1] is empty for 1 <= n <= L - 1, never the tail",
    P + "xǁSelfDraftModelǁforward__mutmut_31": "input_ids None in the rebuilt-router branch: only the hash router reads "
                                                "token ids, and it is refused a rebuild (its table depends on top_k)",
    MP + "__init____mutmut_1": "self.model is never read: the runner holds the model",
    MP + "_sync__mutmut_8": "a shadow's arrival time is never read (no output is made of a shadow)",
    MP + "_sync__mutmut_14": "a shadow's arrival time is never read (no output is made of a shadow)",
    MP + "_forward__mutmut_32": "the order index made on the CPU: index_put_ takes CPU indices for a tensor on any "
                                "device; the same rows are written",
    MP + "_forward__mutmut_34": "as _forward #32 (device dropped: the CPU)",
    MP + "propose__mutmut_26": "max(..., default=1) with no active sequence: step 0 finds none active and breaks",
    MP + "propose__mutmut_30": "unreachable: the loop runs max(k of the active) steps and the sequence with that k "
                               "stays active through every one",
    D + "__init____mutmut_30": "load_model without dtype keeps the stored dtype; the next line's m.to(dtype=dtype) "
                               "casts each tensor once: the same values",
    D + "__init____mutmut_33": "as __init__ #30 (dtype dropped: None)",
    D + "__init____mutmut_32": "load_model on its default device, the CPU; the next line's m.to(device=device) moves "
                               "it: the same tensors on the same device",
    D + "proposer__mutmut_8": "NgramProposer's max_n / min_n are never read: propose takes each request's own "
                              "prompt_lookup_max / min",
    D + "proposer__mutmut_9": "as proposer #8",
    D + "_sample__mutmut_15": "logits[r:r + 2]: target_probs treats each row on its own (the penalty zips rows with "
                              "contexts) and [0] is row r",
    D + "verify__mutmut_16": "contexts built for every request: target_probs reads them only when the "
                              "repetition penalty is not 1",
    D + "verify__mutmut_5": "R = V sizes only the contexts list; the penalty zips it with the R rows' penalties",
}
UNDECIDED: dict[str, str] = {}  # device-dependent survivors: counted as not killed


def load(pattern: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for path in sorted(glob.glob(pattern)):
        out.update({k: v for k, v in json.load(open(path))["exit_code_by_key"].items() if v is not None})
    return out


def main() -> None:
    generated = json.load(open("run5_mutants.json"))
    first = load("run5_drive_*.json")  # drive.py: the first-pass selection alone
    second = load("run5_drive2_*.json")  # drive2.py: the added file first (2), then the selection (1 / 0)
    added = {k for k, v in load("run5_check_*.json").items() if v == 1}
    out = {}
    for module, keys in generated.items():
        ran1 = [k for k in keys if first.get(k) not in (None, 33)]
        ran2 = [k for k in keys if k not in first and second.get(k) not in (None, 33)]
        killed1 = [k for k in ran1 if first[k] == 1]
        survived1 = [k for k in ran1 if first[k] in (0, -24)]  # a timeout counts as a survivor
        by_added1 = [k for k in survived1 if k in added]
        killed2_added = [k for k in ran2 if second[k] == 2]
        killed2_first = [k for k in ran2 if second[k] == 1]
        survived2 = [k for k in ran2 if second[k] in (0, -24)]
        survived = survived1 + survived2
        equivalent = [k for k in survived if k in EQUIVALENT and k not in added]
        killed = len(killed1) + len(by_added1) + len(killed2_added) + len(killed2_first) + \
            len([k for k in survived2 if k in added])
        denom = len(ran1) + len(ran2) - len(equivalent)
        out[module] = dict(
            mutants=len(keys), ran=len(ran1) + len(ran2), ran_first_pass=len(ran1), ran_second_phase=len(ran2),
            not_run=len(keys) - len(ran1) - len(ran2), no_test=sum(first.get(k) == 33 for k in keys),
            first_pass_killed=len(killed1), first_pass_survived=len(survived1),
            first_pass=f"{len(killed1)}/{len(ran1)}" if ran1 else None,
            killed_by_added_test=len(by_added1) + len(killed2_added) + len([k for k in survived2 if k in added]),
            second_phase_killed_by_added_file=len(killed2_added), second_phase_killed_by_selection=len(killed2_first),
            second_phase_survived_both=len(survived2), equivalent=len(equivalent),
            undecided_on_cpu=len([k for k in survived if k in UNDECIDED]),
            final=f"{killed}/{denom}" if denom else None,
            final_pct=round(100 * killed / denom, 1) if denom else None,
            first_pass_survivors_killed_by_added_test=sorted(by_added1),
            equivalent_names={k: EQUIVALENT[k] for k in sorted(equivalent)},
            undecided_names={k: UNDECIDED[k] for k in sorted(survived) if k in UNDECIDED},
            not_killed=sorted(set(survived) - added - set(equivalent)))
    json.dump(out, open("run5_summary.json", "w"), indent=1, ensure_ascii=False)
    for module, row in out.items():
        print(module, {k: v for k, v in row.items() if not isinstance(v, (list, dict))})


if __name__ == "__main__":
    main()
