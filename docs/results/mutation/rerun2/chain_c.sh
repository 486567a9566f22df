#!/bin/bash
# rerun2, continued (mutF): aux_free, checkpointing, then the rest of expert_choice (its partial
# run_drive_expert_choice.json is resumed by drive.py), through ../run4_features/drive.py in mutD's tree
cd /work/mut_mutD/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutF
unset PYTHONPATH
# the same deselection as chain.sh (README.md, "Method")
export PYTEST_ADDOPTS="--deselect tests/engine/sampling/test_guided.py::test_outputs_match_their_regex_choice_grammar_and_schema"
for m in aux_free:moe.routing.routers.aux_free. checkpointing:moe.train.checkpointing. expert_choice:moe.routing.routers.expert_choice.; do
  n=${m%%:*}; p=${m#*:}
  echo "$(date -u +%H:%M:%S) start $n $(cat /proc/loadavg)" >> /tmp/mutF_loadavg_chain.txt
  python drive.py run_drive_$n.json $p 2> /tmp/mutF_drive_$n.err > /tmp/mutF_drive_$n.out
  echo "$(date -u +%H:%M:%S) end $n rc=$? $(cat /proc/loadavg)" >> /tmp/mutF_loadavg_chain.txt
done
