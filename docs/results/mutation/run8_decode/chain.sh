#!/bin/bash
# run8_decode (mutE): the changed functions of the decode-step change since 433c7b3, smallest groups first,
# each group through drive_fast.py (run4_features/drive.py in two stages; run_write.json's first 21 by drive.py itself) (one process at a time)
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
cd /work/mut_mutE/mutants
(date -u; cat /proc/loadavg) >> load_chain_start.txt
nice -n 10 python drive_fast.py run_write.json "moe.attention.paged_torch.xǁWritePlanǁ" \
  "moe.attention.paged_torch.xǁTorchPagedAttentionǁplan_write__" "moe.attention.paged_torch.xǁTorchPagedAttentionǁwrite__" 2> run_write.log
nice -n 10 python drive_fast.py run_target_probs.json "moe.engine.speculative.rejection.x_target_probs__" 2> run_target_probs.log
nice -n 10 python drive_fast.py run_model_attend.json "moe.model.xǁAttentionǁ_attend__" 2> run_model_attend.log
(date -u; cat /proc/loadavg) > load_chain_mid.txt
# (stopped here at 04:33 UTC, the hard stop near: the two groups below did not run)
nice -n 10 python drive_fast.py run_ctx_attend.json "moe.engine.runner.context.xǁPagedKVContextǁattend__" 2> run_ctx_attend.log
nice -n 10 python drive_fast.py run_forward.json "moe.model.xǁAttentionǁforward__" 2> run_forward.log
(date -u; cat /proc/loadavg) > load_chain_end.txt
