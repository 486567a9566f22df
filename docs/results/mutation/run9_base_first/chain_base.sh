#!/bin/bash
# moe/hf/families/base.py's first pass (lead, 2026-12-05): mutmut's mutants and stats of this tree (main at 27f061e, the
# run7_mutS selection with only_mutate = base.py), run4's drive.py, two drivers on disjoint functions
cd /work/mut_base/mutants
export PYTHONPATH=. OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 WANDB_MODE=offline MOE_LAB_DATA=/work/shared/data
B=moe.hf.families.base.
echo "$(date -u +%H:%M:%S) start drivers $(cat /proc/loadavg)" >> /tmp/base_loadavg.txt
(python drive.py run_first_base_a.json "${B}xǁFamilyǁ" "${B}x_rope_fields_" 2> /tmp/base_a.err > /tmp/base_a.out;
 echo "$(date -u +%H:%M:%S) end driver a $(cat /proc/loadavg)" >> /tmp/base_loadavg.txt) &
python drive.py run_first_base_b.json "${B}x_hf_rope_parameters_" "${B}x_hf_head_dim_" "${B}x_common_" "${B}x_dense_" \
  "${B}x_layer_fields_" "${B}x_hf_layer_fields_" 2> /tmp/base_b.err > /tmp/base_b.out
echo "$(date -u +%H:%M:%S) end driver b $(cat /proc/loadavg)" >> /tmp/base_loadavg.txt
wait
