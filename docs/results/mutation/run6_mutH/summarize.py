"""summary.json of the sixth run (mutH) from the raw verdicts here (run as `python summarize.py` in this folder).

Inputs: `run_drive_*.json` (drive.py: the first pass, the modules' own tests; codes 1 killed, 0 survived,
33 no test of the selection, -24 time limit), `run_drive3_*.json` (drive3.py: the added file first,
code 2 = killed by it, then the first-pass tests: 1 / 0 / -24 / 33 as above, or 3: survived the
added file, first pass not run; a later file of the same module overrides an earlier one, sorted by name), `mutants.json` (every
mutant mutmut generated, by module) and EQUIVALENT below (argued in README.md, with the reason).
"""

from __future__ import annotations

import glob
import json
from collections import Counter

# name -> reason (README.md gives each in full)
EQUIVALENT = {
    # tensor_map.py
    "moe.hf.tensor_map.x_tensor_rows__mutmut_42":
        "_nextn_rows(cfg, fam, None): it is only called for layout 'hub', and below it layout is only "
        "compared with 'memory' (_moe_rows), which None is not either: the same rows",
    "moe.hf.tensor_map.x__nextn_rows__mutmut_34": "_block_rows(..., None, ...) in _nextn_rows: as tensor_rows #42",
    "moe.hf.tensor_map.x__block_rows__mutmut_5": "q rows slice(None, H*d) is slice(0, H*d)",
    "moe.hf.tensor_map.x__block_rows__mutmut_7": "q rows slice(H*d) is slice(0, H*d)",
    "moe.hf.tensor_map.x__block_rows__mutmut_23":
        "v rows slice((H+G)*d, None): qkv_proj has exactly (H+2G)*d rows (its out_features), so the "
        "slice ends at the same row",
    "moe.hf.tensor_map.x__block_rows__mutmut_31": "v rows up to (H+3G)*d: clipped at the (H+2G)*d rows qkv_proj has (#23)",
    "moe.hf.tensor_map.x__moe_rows__mutmut_78": "gate rows slice(None, Hx) is slice(0, Hx)",
    "moe.hf.tensor_map.x__moe_rows__mutmut_80": "gate rows slice(Hx) is slice(0, Hx)",
    "moe.hf.tensor_map.x__moe_rows__mutmut_88":
        "up rows slice(Hx, None): gate_up_proj[e] has exactly 2*Hx rows, so the slice ends at the same row",
    "moe.hf.tensor_map.x__moe_rows__mutmut_92": "up rows up to 3*Hx: clipped at the 2*Hx rows (#88)",
    # convert.py
    "moe.hf.convert.x_mixtral_config__mutmut_4":
        "hf_config(model_cfg, **extra) without 'mixtral': hf_config's default model_type is 'mixtral'",
    "moe.hf.convert.x_to_hf_model__mutmut_28": "load_state_dict(...) without strict: its default is strict=True",
    "moe.hf.convert.x_to_hf_model__mutmut_33":
        "load_state_dict(strict=False): to_hf_state_dict gives exactly the HF model's keys and shapes "
        "(tests/hf/test_tensor_map_mut.py, every family), so strict has nothing to refuse",
    "moe.hf.convert.x_to_hf_model__mutmut_26": "strict=None: falsy, as strict=False (#33)",
    # hf/mxfp4.py
    "moe.hf.mxfp4.x_dequantize_mxfp4__mutmut_8":
        "blocks.shape[-1] != 32 / 2: 16 != 16.0 is False in Python, as 16 != 16",
    "moe.hf.mxfp4.x_dequantize_mxfp4__mutmut_23":
        "blocks.to(None) keeps the dtype: for integer codes (uint8 as stored; an int8 view, whose >> 4 "
        "gives nibble - 16, indexing the 16-entry table at the same entry; wider ints holding 0-255) "
        "& 0x0F and >> 4 pick the same table entries; only floating-point codes, which the contract "
        "('uint8 codes') and every loader (safetensors U8) exclude, would differ",
    # awq.py
    "moe.quant.awq.x_search_scale__mutmut_4":
        "the early return tested on x.shape[1] == 0: with 0 rows the search itself returns ones (x_mean "
        "is NaN, every error NaN, never < inf, so best_s stays ones(I)); only a weight with 0 input "
        "channels differs (the original fails in s.max(), the mutant returns an empty scale): no layer has one",
    "moe.quant.awq.x_search_scale__mutmut_27": "float('INF') is float('inf')",
    "moe.quant.awq.x__experts__mutmut_13": "(experts_NK == e).any(+1): experts_NK is 2-D, so dim 1 is dim -1",
    "moe.quant.awq.x__experts__mutmut_24": "chunk(2, dim=+1) of the 2-D [N, 2H] product: dim 1 is dim -1",
}
# device mutants that a CPU-only machine cannot decide: counted as not killed
UNDECIDED_ON_CPU = {
    "moe.hf.convert.x_from_hf_state_dict__mutmut_33":
        "lm_head.to(None, embed.dtype): the head is not moved to the embedding's device before torch.equal",
    "moe.hf.convert.x_from_hf_state_dict__mutmut_35": "lm_head.to(embed.dtype): as #33",
    "moe.hf.convert.x_from_hf_model__mutmut_28":
        "load_tensors_into(..., device dropped): its default is 'cpu', the HF model's device on this machine; "
        "an HF model on a GPU would be imported onto the CPU (the meta device cannot stand in: from_hf_model "
        "needs values)",
    "moe.quant.awq.x__capture__mutmut_57":
        "calibration ids .to(None): not moved to the model's device; the same on a CPU model (a meta model "
        "cannot stand in: its forward needs CPU tensors in the original too)",
}


def main() -> None:
    generated = json.load(open("mutants.json"))
    first: dict[str, int] = {}
    for path in sorted(glob.glob("run_drive_*.json")):
        first.update({k: v for k, v in json.load(open(path))["exit_code_by_key"].items() if v is not None})
    third: dict[str, int] = {}
    for path in sorted(glob.glob("run_drive3_*.json")):
        third.update(json.load(open(path))["exit_code_by_key"])
    out = {}
    for module, keys in generated.items():
        ran_fp = [k for k in keys if first.get(k) in (0, 1, -24)]
        killed_fp = [k for k in ran_fp if first[k] == 1]
        killed = [k for k in keys if first.get(k) == 1 or third.get(k) in (1, 2)]
        by_added = [k for k in keys if first.get(k) != 1 and third.get(k) == 2]
        by_added_unmeasured = [k for k in by_added if k not in first or first[k] == 33]
        by_fp_after = [k for k in keys if k not in first and third.get(k) == 1]  # drive3: killed by the first-pass tests
        reached = [k for k in keys if first.get(k) in (0, 1, -24) or third.get(k) in (0, 1, 2, 3, -24)]
        no_test = [k for k in keys if k not in reached and (first.get(k) == 33 or third.get(k) == 33)]
        not_run = [k for k in keys if k not in reached and k not in no_test]
        survived = [k for k in reached if k not in killed]
        equivalent = [k for k in survived if k in EQUIVALENT]
        denom = len(reached) - len(equivalent)
        out[module] = dict(
            mutants=len(keys), ran=len(reached), first_pass_ran=len(ran_fp), first_pass_killed=len(killed_fp),
            first_pass_survived=len(ran_fp) - len(killed_fp), first_pass_timeout=Counter(first.values())[-24],
            killed_by_added_test=len(by_added), of_which_first_pass_not_measured=len(by_added_unmeasured),
            killed_by_first_pass_tests_in_drive3=len(by_fp_after), no_test=len(no_test), not_run=len(not_run),
            equivalent=len(equivalent),
            final=f"{len(killed)}/{denom}" if denom else None,
            final_pct=round(100 * len(killed) / denom, 1) if denom else None,
            first_pass=f"{len(killed_fp)}/{len(ran_fp)}" if ran_fp else None,
            first_pass_pct=round(100 * len(killed_fp) / len(ran_fp), 1) if ran_fp else None,
            equivalent_names={k: EQUIVALENT[k] for k in sorted(equivalent)},
            undecided_on_cpu={k: UNDECIDED_ON_CPU[k] for k in sorted(survived) if k in UNDECIDED_ON_CPU},
            not_killed=sorted(set(survived) - set(equivalent)), no_test_names=sorted(no_test))
    json.dump(out, open("summary.json", "w"), indent=1, ensure_ascii=False)
    for module, row in out.items():
        print(module, {k: v for k, v in row.items() if not isinstance(v, (list, dict))})


if __name__ == "__main__":
    main()
