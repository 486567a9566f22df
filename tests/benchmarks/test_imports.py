"""Every benchmark module imports (one went stale after a rename of moe.config's router class and
failed only when someone ran it)."""

import importlib
import pkgutil
from pathlib import Path

import pytest

import benchmarks

MODULES = sorted(m.name for m in pkgutil.iter_modules([str(Path(benchmarks.__file__).parent)]))


def test_the_benchmarks_are_found():
    assert {"generate", "lm_eval_speed", "offload", "plan_speed"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_benchmark_module_imports(name):
    module = importlib.import_module(f"benchmarks.{name}")
    assert module.__doc__, f"benchmarks/{name}.py has no docstring saying what it measures"
