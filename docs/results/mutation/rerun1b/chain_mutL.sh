#!/bin/bash
# rerun1b continued (mutL): moe/engine/sampling/sampler.py then eval/tasks/truthfulqa.py
# through ../run4_features/drive.py in a copy of mutB's run directory (rsync -a /work/mut_mutB/ /work/mut_mutL/:
# the same mutants and stats, made at 433c7b3), at nice 19.
# Usage: chain_mutL.sh a | b | c   (run side by side: see README.md)
#   a: SamplingParams and apply_repetition_penalty (run_drive_sampler.json), then truthfulqa.py
#   b: the Sampler class's methods (run_drive_sampler_b.json)
#   c: top_k_top_p_min_p_mask, row_argmax, finite_rows (run_drive_sampler_c.json)
# (its first version ran the whole module prefix alone; stopped after 43 verdicts, it went on as
# "a" with every module-level function, alongside "b"; stopped again after 131, it went on as "a" and "c"
# above: drive.py resumes a stopped run from its file)
cd /work/mut_mutL/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutL
unset PYTHONPATH
S=moe.engine.sampling.sampler.
log() { echo "$(date -u +%H:%M:%S) $* $(cat /proc/loadavg)" >> /tmp/mutL_loadavg_chain.txt; }
if [ "$1" = a ]; then
  log "start sampler (a: SamplingParams, apply_repetition_penalty)"
  nice -n 19 python drive.py run_drive_sampler.json "${S}xǁSamplingParamsǁ" "${S}x_apply_repetition_penalty_" 2>> /tmp/mutL_drive_sampler.err > /tmp/mutL_drive_sampler.out
  log "end sampler (a) rc=$?"
  log "start truthfulqa"
  nice -n 19 python drive.py run_drive_truthfulqa.json "eval.tasks.truthfulqa." 2> /tmp/mutL_drive_truthfulqa.err > /tmp/mutL_drive_truthfulqa.out
  log "end truthfulqa rc=$?"
elif [ "$1" = c ]; then
  log "start sampler (c: top_k_top_p_min_p_mask, row_argmax, finite_rows)"
  nice -n 19 python drive.py run_drive_sampler_c.json "${S}x_top_k_top_p_min_p_mask_" "${S}x_row_argmax_" "${S}x_finite_rows_" 2> /tmp/mutL_drive_sampler_c.err > /tmp/mutL_drive_sampler_c.out
  log "end sampler (c) rc=$?"
else
  log "start sampler (b: Sampler)"
  nice -n 19 python drive.py run_drive_sampler_b.json "${S}xǁSamplerǁ" 2> /tmp/mutL_drive_sampler_b.err > /tmp/mutL_drive_sampler_b.out
  log "end sampler (b) rc=$?"
fi
