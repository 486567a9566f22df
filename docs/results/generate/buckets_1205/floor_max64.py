"""decode_floor with the CPU's compiled batch bound raised to 64 (the step at batch 64 compiled: the measurement
behind `cpu_max_batch` not being 64). Run from the repository root: PYTHONPATH=$PWD python <this> <decode_floor args>"""
import sys

from moe.engine.runner.compiled import CompiledModelRunner

CompiledModelRunner.cpu_max_batch = 64
import benchmarks.decode_floor as D  # noqa: E402

sys.exit(D.main(sys.argv[1:]))
