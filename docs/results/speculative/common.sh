# Sourced by train.sh and bench.sh: the environment of every run and `timed NAME CMD...`, which runs
# CMD with its console log in NAME.log and NAME.meta.txt holding the commit, the load average before
# and after, and /usr/bin/time's wall and CPU (user + sys) seconds of the whole process.
set -euo pipefail
REC=${SPEC_REC:-docs/results/speculative}   # a re-run records into its own folder (SPEC_REC)
cd "$(git rev-parse --show-toplevel)"
mkdir -p "$REC"
export OMP_NUM_THREADS=1 PYTHONPATH=$PWD MOE_LAB_DATA=${MOE_LAB_DATA:-/work/shared/data}
export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
CK=${SPEC_CKPTS:-/tmp/spec_ckpts}   # trained checkpoints live outside the repository
TARGET_CODE=${TARGET_CODE:-/work/ckpt/default}   # plain `python train.py` (the default run)

timed() {
    local name=$1; shift
    local meta=$REC/$name.meta.txt
    [ -e "$meta" ] && { echo "error: $meta exists (this script does not overwrite a record)" >&2; exit 2; }
    {
        echo "command: $*"
        echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- moe benchmarks || echo ' (moe/ or benchmarks/ modified)')"
        echo "start: $(date -u +%FT%TZ)"
        echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    } > "$meta"
    local rc=0
    /usr/bin/time -o "$meta.time" -f "wall_s %e user_s %U sys_s %S max_rss_kb %M" "$@" > "$REC/$name.log" 2>&1 || rc=$?
    { cat "$meta.time"; echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"; echo "end: $(date -u +%FT%TZ)"; echo "exit: $rc"; } >> "$meta"
    rm -f "$meta.time"
    return $rc
}
