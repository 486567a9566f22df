#!/usr/bin/env bash
# Measures the venv size and install time of one set-up line in a fresh venv.
# Usage (from the repository root): docs/results/install/measure.sh <spec> <label> <out.json> [<torch spec>]
#   e.g. docs/results/install/measure.sh . train docs/results/install/train_1.json
#        docs/results/install/measure.sh ".[dev]" dev docs/results/install/dev_1.json
#        docs/results/install/measure.sh . train_cpu_torch docs/results/install/train_cpu_torch_1.json "torch==2.13.0+cpu"
# With a torch spec, that torch is installed first (the README's CPU-only line; here from the local
# wheel folder, as this machine has no route to download.pytorch.org), inside the timed part.
# pip resolves from this machine's configuration (pip config list), which here serves torch
# and the other wheels from local disk; the time therefore excludes most download time.
set -euo pipefail
spec="$1"; label="$2"; out="$3"; torch_spec="${4:-}"
tmp="$(mktemp -d /tmp/moe-lab-install-XXXX)"; venv="$tmp/venv"; log="$tmp.log"
trap 'rm -rf "$tmp"' EXIT   # the venv never outlives the measurement; the pip log stays in $tmp.log
python -m venv "$venv"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s.%N)
if [ -n "$torch_spec" ]; then "$venv/bin/python" -m pip install -q "$torch_spec" > "$log" 2>&1; fi
"$venv/bin/python" -m pip install -q -e "$spec" >> "$log" 2>&1
end=$(date +%s.%N)
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"
size_bytes=$(du -sb "$venv" | cut -f1)
n_packages=$("$venv/bin/python" -m pip list --format=freeze 2>/dev/null | wc -l)
torch_version=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
cmd="python -m venv VENV && "
if [ -n "$torch_spec" ]; then cmd+="VENV/bin/python -m pip install -q '$torch_spec' && "; fi
cmd+="VENV/bin/python -m pip install -q -e '$spec'"
LABEL="$label" CMD="$cmd" SECONDS_TAKEN="$(python -c "print(round($end - $start, 1))")" SIZE="$size_bytes" \
NPKG="$n_packages" TORCH="$torch_version" LOAD_BEFORE="$load_before" LOAD_AFTER="$load_after" python - "$out" <<'PY'
import json, os, platform, subprocess, sys
e = os.environ
json.dump({
    "label": e["LABEL"], "command": e["CMD"],
    "install_seconds": float(e["SECONDS_TAKEN"]), "venv_bytes": int(e["SIZE"]),
    "venv_gib": round(int(e["SIZE"]) / 2**30, 2), "n_packages": int(e["NPKG"]), "torch": e["TORCH"],
    "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "machine": {"cpu_cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
    "loadavg_1_5_15_before": e["LOAD_BEFORE"], "loadavg_1_5_15_after": e["LOAD_AFTER"],
    "pip_config": subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout.splitlines(),
}, open(sys.argv[1], "w"), indent=1)
PY
cat "$out"
