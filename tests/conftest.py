import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")
# Triton kernels run in Triton's interpreter on machines without CUDA. `@triton.jit` reads
# this when a kernel module is imported, so it must be set before any test imports moe.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_SILENT", "true")
# Every engine built in the tests asserts its scheduler / KV-block invariants after every step
# (moe/engine/core/invariants.py; EngineConfig.check_invariants reads this; off in production).
os.environ.setdefault("MOE_CHECK_INVARIANTS", "1")
# Under pytest-xdist (`-n auto`, the README's test command) each worker gets its share of the cores for
# intra-op threads, and so do the processes it starts (OMP_NUM_THREADS): N workers each using every core
# oversubscribe the machine (2 cores, clean-clone CI: 436 s of pytest with two threads a worker, 415 s with
# one, one run each; serial, 746-758 s: docs/results/test_suite).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Shared fixtures that tests in more than one directory use (lazy: built only when asked for).
pytest_plugins = ["tests.serve_fixtures", "tests.hf_fixtures"]

REPO = Path(__file__).resolve().parents[1]
# `../shared/data` beside the checkout; MOE_LAB_DATA (as in eval/common.py) points elsewhere when the
# tests run from a copy one level deeper (mutation testing runs them inside `mutants/`, docs/guides/testing.md).
SHARED_DATA = Path(os.environ.get("MOE_LAB_DATA") or REPO.parent / "shared" / "data")


def pytest_collection_modifyitems(config, items):
    """Under mutation testing (mutmut sets MUTANT_UNDER_TEST to a mutant's name), run the tests
    fastest first by the call times mutmut recorded (`mutmut-stats.json`), file by file (a module's
    fixtures are built once): a killed mutant stops at its first failing test (`-x`), and mutmut
    hands its tests over in no particular order. Which tests run, and so every verdict, is the same."""
    if not os.environ.get("MUTANT_UNDER_TEST", "").startswith(("moe.", "eval.", "kernels.")):
        return
    stats = Path("mutmut-stats.json")
    if not stats.is_file():
        return
    took = json.loads(stats.read_text()).get("duration_by_test", {})
    by_file: dict = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0], []).append(item)
    cost = lambda it: took.get(it.nodeid, float("inf"))  # noqa: E731
    files = sorted(by_file.values(), key=lambda its: min(cost(it) for it in its))
    items[:] = [it for its in files for it in sorted(its, key=cost)]


@pytest.fixture
def one_thread():
    """Tiny models: intra-op threads only add sync overhead (and spin badly on shared cores), so
    a test that uses this runs single-threaded, the setting restored after. Modules opt in with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def with_variants(cfg, router=None, attention=None, experts=None):
    """A copy of ModelConfig `cfg` with its router config and attention / expert-dispatch variant
    replaced (names or configs), for tests that build several variants of one model."""
    import dataclasses

    from moe.config import AttentionConfig, ExpertsConfig
    kw = {}
    if router is not None:
        kw["router"] = router
    if attention is not None:
        kw["attention"] = attention if not isinstance(attention, str) else AttentionConfig(name=attention)
    if experts is not None:
        kw["experts"] = experts if not isinstance(experts, str) else ExpertsConfig(name=experts)
    return dataclasses.replace(cfg, **kw)


def tiny_model_config(**kw):
    from moe.config import ModelConfig
    base = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=24,
                max_seq_len=64)
    base.update(kw)
    return ModelConfig(**base)
