#!/bin/bash
# usage: run.sh TAG SITE(empty=main env) ARCH PARTS OUTDIR
TAG=$1; SITE=$2; ARCH=$3; PARTS=$4; OUT=$5
cd /work/wt/tr39
PP=/work/wt/tr39${SITE:+:$SITE}
export TRITON_CACHE_DIR=/work/tr39_cache/$TAG
rm -rf "$TRITON_CACHE_DIR"; mkdir -p "$TRITON_CACHE_DIR" "$OUT"
{
echo "date start: $(date -u)"; echo "loadavg start: $(cat /proc/loadavg)"; echo "nproc: $(nproc)"
echo "commit: $(git rev-parse HEAD)"
PYTHONPATH=$PP python -c "import triton, torch; print('triton', triton.__version__, triton.__file__); print('torch', torch.__version__)"
echo "TRITON_CACHE_DIR=$TRITON_CACHE_DIR (empty at start)"
echo "command: OMP_NUM_THREADS=1 PYTHONPATH=$PP TRITON_CACHE_DIR=$TRITON_CACHE_DIR nice -n 5 /usr/bin/time -v python -m kernels.compile_check --arch $ARCH --parts $PARTS --json $OUT/$TAG.json"
} > $OUT/$TAG.console.txt 2>&1
OMP_NUM_THREADS=1 PYTHONPATH=$PP nice -n 5 /usr/bin/time -v python -m kernels.compile_check --arch $ARCH --parts $PARTS --json $OUT/$TAG.json >> $OUT/$TAG.console.txt 2>&1
echo "exit: $?" >> $OUT/$TAG.console.txt
{ echo "date end: $(date -u)"; echo "loadavg end: $(cat /proc/loadavg)"; } >> $OUT/$TAG.console.txt
