#!/bin/bash
# Inductor's C++ wrapper for the compiled CPU decode graphs (CompiledModelRunner.cpu_cpp_wrapper) against the Python
# wrapper, interleaved, three invocations each: issue 32's `small` batch-1 workload (eager engine, compiled engine,
# HF one prompt at a time) and the tiny model's compiled-vs-eager workloads at batch 1 and at most 8.
# `python_wrapper.py` is the same benchmark with `cpu_cpp_wrapper = False`. Both arms guard-free. Each arm's first
# invocation compiles into an empty inductor cache of its own (TORCHINDUCTOR_CACHE_DIR), so compile time is cold
# there and warm in the other two. Run from the repository root on a quiet machine:
#   OMP_NUM_THREADS=1 PYTHONPATH=$PWD bash docs/results/generate/cpp_wrapper_1205/run.sh
R=$(cd "$(dirname "$0")" && pwd)
export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
SMALL="--d-model 512 --n-layers 8 --n-heads 8 --n-kv-heads 4 --n-experts 8 --expert-hidden 768"
git rev-parse --short HEAD > $R/commit.txt
run() { # name cmd...
  name=$1; shift
  case $name in *_cpp_*) export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cpp_1205;; *) export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_py_1205;; esac
  [ -e $R/$name.json ] && { echo "error: $R/$name.json exists" >&2; exit 2; }
  echo "$(date -u +%T) start $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
  /usr/bin/time -f "%e s wall %U user %S sys" python "$@" --json $R/$name.json > $R/$name.txt 2>&1
  echo "$(date -u +%T) end $name rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
}
for i in 1 2 3; do
  run small_b1_cpp_$i -m benchmarks.generate $SMALL --compile --num-prompts 6 --max-num-seqs 1 --hf sequential --threads 1 --repeats 3
  run small_b1_pywrap_$i $R/python_wrapper.py $SMALL --compile --num-prompts 6 --max-num-seqs 1 --hf sequential --threads 1 --repeats 3
  run b8_cpp_$i -m benchmarks.generate --compile --hf none --max-num-seqs 8 --num-prompts 16 --repeats 3 --threads 1
  run b8_pywrap_$i $R/python_wrapper.py --compile --hf none --max-num-seqs 8 --num-prompts 16 --repeats 3 --threads 1
  run b1_cpp_$i -m benchmarks.generate --compile --hf none --max-num-seqs 1 --num-prompts 8 --repeats 3 --threads 1
  run b1_pywrap_$i $R/python_wrapper.py --compile --hf none --max-num-seqs 1 --num-prompts 8 --repeats 3 --threads 1
done
