"""`python -m benchmarks.generate` with the compiled runner's CPU graphs compiled without inductor's C++ wrapper
(`CompiledModelRunner.cpu_cpp_wrapper = False`: the Python wrapper, as before): the A/B's other arm. Same
arguments."""
import sys

from benchmarks import generate
from moe.engine.runner.compiled import CompiledModelRunner

CompiledModelRunner.cpu_cpp_wrapper = False
sys.exit(generate.main(sys.argv[1:]))
