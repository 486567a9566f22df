"""Which added test kills the survivors whose kill needs a particular test (README.md here): each
named test alone, with no mutant (must pass, 0) and with the mutant (must fail, 1). Run in `mutants/`:

    python attribution.py attribution.json
"""

from __future__ import annotations

import json
import sys

from drive import run_tests

S = "moe.attention.sdpa.xǁSDPAAttentionǁ__call____mutmut_"
E = "moe.attention.eager.x_eager_attention__mutmut_"
SD, EA = "tests/attention/test_sdpa_mut.py::", "tests/attention/test_eager_mut.py::"
CASES = [
    (SD + "test_grouped_query_heads_when_a_length_equals_a_head_count", [S + "3", S + "5"]),
    (SD + "test_a_document_mask_without_sinks_takes_the_fused_kernel", [S + "40"]),
    (SD + "test_a_document_mask_with_sinks_equals_eager", [S + "40"] + [S + str(n) for n in range(41, 55)]),
    (SD + "test_the_mask_follows_the_inputs_device_not_the_default_device", [S + "32"]),
    (SD + "test_non_causal_with_a_layer_option_is_refused_with_the_whole_message", [S + str(n) for n in range(22, 28)]),
    (EA + "test_the_mask_follows_the_inputs_device_not_the_default_device", [E + "44"]),
    (EA + "test_non_causal_with_a_window_or_document_mask_is_refused_with_the_whole_message",
     [E + str(n) for n in range(36, 40)]),
    (EA + "test_per_head_sinks_with_several_rows_match_a_hand_computation", [E + "84"]),
    (EA + "test_the_class_forwards_every_option",
     ["moe.attention.eager.xǁEagerAttentionǁ__call____mutmut_" + str(n) for n in (6, 7, 8, 13, 14, 15)]),
]

out = []
for test, mutants in CASES:
    row = {"test": test, "clean": run_tests([test], ""), "exit_code_by_key": {}}
    for m in mutants:
        row["exit_code_by_key"][m] = run_tests([test], m)
    out.append(row)
    json.dump(out, open(sys.argv[1], "w"), indent=1, ensure_ascii=False)
