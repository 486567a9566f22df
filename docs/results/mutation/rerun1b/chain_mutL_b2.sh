#!/bin/bash
# rerun1b continued (mutL): the tail of Sampler.sample (#140 to #178; the prefixes also take #14 to #17,
# which chain_mutL.sh b had already run: merge_mutL.py lists both verdicts), started after the driver of
# chain_mutL.sh a ended (chain_mutL.sh c not yet ended: four drivers for about ten minutes), alongside b (then at #98), b3 and c;
# run_drive_sampler_b2.json
cd /work/mut_mutL/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutL
unset PYTHONPATH
S="moe.engine.sampling.sampler.xǁSamplerǁsample__mutmut_"
echo "$(date -u +%H:%M:%S) start sampler (b2: sample #140-#178) $(cat /proc/loadavg)" >> /tmp/mutL_loadavg_chain.txt
nice -n 19 python drive.py run_drive_sampler_b2.json "${S}14" "${S}15" "${S}16" "${S}17" \
  2> /tmp/mutL_drive_sampler_b2.err > /tmp/mutL_drive_sampler_b2.out
echo "$(date -u +%H:%M:%S) end sampler (b2) rc=$? $(cat /proc/loadavg)" >> /tmp/mutL_loadavg_chain.txt
