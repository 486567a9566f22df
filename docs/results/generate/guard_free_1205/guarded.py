"""`python -m benchmarks.generate` with the compiled runner's guard-free calls turned off: every compiled step
goes through dynamo's guards, as before guard_free.py (the A/B's other arm). Same arguments."""
import sys

from benchmarks import generate
from moe.engine.runner.compiled import CompiledModelRunner

CompiledModelRunner.guard_free = False
sys.exit(generate.main(sys.argv[1:]))
