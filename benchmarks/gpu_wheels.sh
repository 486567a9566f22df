#!/usr/bin/env bash
# Fetch, on the development machine, the pure-Python packages the GPU machine's image lacks into
# .whl/ (git-ignored), so `benchmarks/gpu_session.sh` can install them there without a network.
# The image has torch, triton, transformers, tokenizers, numpy, pyyaml, pytest; moe.config also
# needs omegaconf, whose parser runtime (antlr4 4.9.3) is published only as an sdist, so it is built
# into a wheel here.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python -m pip download -q --no-deps --only-binary=:all: -d .whl "omegaconf==2.3.0"
python -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==4.9.3"
ls -l .whl
