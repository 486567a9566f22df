#!/bin/bash
# rerun1b continued (mutL): Sampler.sample #120 to #139 (the prefixes also take #12 and #13,
# which chain_mutL.sh b had already run: merge_mutL.py lists both verdicts), started when the driver of
# chain_mutL.sh a ended (in place of its truthfulqa.py part), alongside b (then at #97) and b2;
# run_drive_sampler_b3.json
cd /work/mut_mutL/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutL
unset PYTHONPATH
S="moe.engine.sampling.sampler.xǁSamplerǁsample__mutmut_"
echo "$(date -u +%H:%M:%S) start sampler (b3: sample #120-#139) $(cat /proc/loadavg)" >> /tmp/mutL_loadavg_chain.txt
nice -n 19 python drive.py run_drive_sampler_b3.json "${S}12" "${S}13" \
  2> /tmp/mutL_drive_sampler_b3.err > /tmp/mutL_drive_sampler_b3.out
echo "$(date -u +%H:%M:%S) end sampler (b3) rc=$? $(cat /proc/loadavg)" >> /tmp/mutL_loadavg_chain.txt
