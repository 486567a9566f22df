#!/bin/bash
# before (11debea) / after (wt-rec) runs of the changed tests/distributed files
export OMP_NUM_THREADS=1 WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
F=/work/wt/rec/docs/results/test_suite/files.sh
bash $F /tmp/rec_base /work/wt/rec/outputs/rec/suite/dist_before_1.txt tests/distributed
bash $F /work/wt/rec /work/wt/rec/outputs/rec/suite/dist_after_1.txt tests/distributed
