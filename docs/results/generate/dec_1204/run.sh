#!/bin/bash
# The runs of this record, in order (the decode-profile pair 1 and b1_before_1 ran first, from the same
# commands, in an earlier chain: runs.log). AFTER=<checkout of e8bfba4> BEFORE=<checkout of a6a973b> bash run.sh
R=$(cd "$(dirname "$0")" && pwd)  # this folder
export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data
run() { # name dir cmd...
  name=$1; dir=$2; shift 2
  echo "$(date -u +%T) start $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
  ( cd $dir && PYTHONPATH=$dir /usr/bin/time -f "%e s wall %U user %S sys" python -m "$@" ) > $R/$name.txt 2>&1
  echo "$(date -u +%T) end $name rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
}
A=${AFTER:?a checkout of the after commit}; B=${BEFORE:?a checkout of the before commit (git archive a6a973b)}
for i in 1 2 3; do run attn_$i $A benchmarks.paged_decode_torch --batches 1 8 64 --json $R/attn_$i.json; done
run b1_after_1 $A benchmarks.generate --num-prompts 6 --max-num-seqs 1 --hf sequential --threads 1 --repeats 3 --json $R/b1_after_1.json
for i in 1 2 3; do
  [ $i -gt 1 ] && { run b1_before_$i $B benchmarks.generate --num-prompts 6 --max-num-seqs 1 --hf sequential --threads 1 --repeats 3 --json $R/b1_before_$i.json
                    run b1_after_$i $A benchmarks.generate --num-prompts 6 --max-num-seqs 1 --hf sequential --threads 1 --repeats 3 --json $R/b1_after_$i.json; }
  run p32_before_$i $B benchmarks.generate --num-prompts 32 --hf batched --hf-batch-sizes 8 0 --threads 1 --repeats 3 --json $R/p32_before_$i.json
  run p32_after_$i $A benchmarks.generate --num-prompts 32 --hf batched --hf-batch-sizes 8 0 --threads 1 --repeats 3 --json $R/p32_after_$i.json
  [ $i -lt 3 ] && for side in before after; do d=$B; [ $side = after ] && d=$A
    run dp_${side}_$((i+1)) $d benchmarks.decode_profile --batches 1 8 64 --steps 16 --json $R/dp_${side}_$((i+1)).json; done
  [ $i = 1 ] && run b1c_after_1 $A benchmarks.generate --num-prompts 6 --max-num-seqs 1 --hf sequential --threads 1 --repeats 3 --compile --json $R/b1c_after_1.json
done
