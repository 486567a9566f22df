#!/bin/bash
# rerun2 (mutD): the second chain, started beside chain.sh (README.md, "Method"): TruthfulQA, then the checkpoint modules
cd /work/mut_mutD/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutD
unset PYTHONPATH
# order-dependent outside these modules: it counts the guided-grammar cache misses of a module-scoped LLM,
# so it fails when the driver's order (by duration) runs another guided test on that LLM first; it failed
# the first clean run of the topk tests (clean_before 1; README.md, "Method")
export PYTEST_ADDOPTS="--deselect tests/engine/sampling/test_guided.py::test_outputs_match_their_regex_choice_grammar_and_schema"
T=eval.tasks.truthfulqa
for m in "truthfulqa:$T.x_load_docs__ $T.x__rows_from_dir__ $T.x__categories__ $T.x__targets__" \
         resume:moe.train.resume. checkpointing:moe.train.checkpointing. checkpoint:moe.checkpoint.; do
  n=${m%%:*}; p=${m#*:}
  echo "$(date -u +%H:%M:%S) start $n $(cat /proc/loadavg)" >> /tmp/mutD_loadavg_chain_b.txt
  nice -n 10 python drive.py run_drive_$n.json $p 2> /tmp/mutD_drive_$n.err > /tmp/mutD_drive_$n.out
  echo "$(date -u +%H:%M:%S) end $n rc=$? $(cat /proc/loadavg)" >> /tmp/mutD_loadavg_chain_b.txt
done
