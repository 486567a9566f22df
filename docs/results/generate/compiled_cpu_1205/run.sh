#!/bin/bash
# usage: bash docs/results/generate/compiled_cpu_1205/run.sh NAME MODEL B VARIANT...   (from the repository root)
# One invocation of ab.py with inductor's caches off (every variant compiles cold and from its own graph: with
# the FX graph cache on, a variant whose graph matched an earlier one's reused it), its stdout and the load beside.
D=docs/results/generate/compiled_cpu_1205
name=$1; shift
cache=$(mktemp -d /tmp/perfC_ind.XXXX)
{ echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg) nproc $(nproc)"
  echo "# OMP_NUM_THREADS=1 TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 TORCHINDUCTOR_CACHE_DIR=<fresh> python $D/ab.py $* $D/$name.json"
  OMP_NUM_THREADS=1 TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 TORCHINDUCTOR_CACHE_DIR=$cache python $D/ab.py "$@" $D/$name.json 2>&1 | grep -v "Warning\|cpp_extension\|warnings.warn"
  echo "# end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"; } > $D/$name.txt
rm -rf $cache
