#!/bin/bash
# interleaved before (11debea, /tmp/rec_base) / after (wt-rec) runs of the changed test_config.py tests
export OMP_NUM_THREADS=1 WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
F=/work/wt/rec/docs/results/test_suite/files.sh
for r in 1 2 3; do
  bash $F /tmp/rec_base /work/wt/rec/outputs/rec/suite/config_before_$r.txt tests/test_config.py -k "train_py or variant_that or new_checks"
  bash $F /work/wt/rec /work/wt/rec/outputs/rec/suite/config_after_$r.txt tests/test_config.py -k "train_py or variant_that or new_checks"
done
