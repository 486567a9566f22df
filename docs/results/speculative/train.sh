#!/usr/bin/env bash
# The three checkpoints the benchmark needs beside the default run (the code target), with the
# recipes of docs/design/speculative.md ("Checkpoints") at today's defaults (200 steps).
source "$(dirname "$0")/common.sh"
D="model.n_layers=1 model.d_model=64 model.n_heads=2 model.n_kv_heads=1 model.n_experts=4 model.expert_hidden=64"
TS=$MOE_LAB_DATA/corpus/tinystories_train_head.txt
mkdir -p "$CK"
timed train_code_draft python train.py logger=none hydra.run.dir=$CK/spec_code_draft $D data.tokenizer_path=$TARGET_CODE/tokenizer
timed train_prose python train.py logger=none hydra.run.dir=$CK/spec_prose data=text data.path=$TS
timed train_prose_draft python train.py logger=none hydra.run.dir=$CK/spec_prose_draft data=text data.path=$TS $D \
    data.tokenizer_path=$CK/spec_prose/tokenizer
for run in spec_code_draft spec_prose spec_prose_draft; do   # what each run was (its config) and reached
    mkdir -p $REC/ckpts/$run && cp $CK/$run/summary.json $CK/$run/config.json $REC/ckpts/$run/
done
