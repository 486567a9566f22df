"""Fixtures for the evaluation tests: one tiny checkpoint, trained once per session (~10 s),
its loaded model, and its HF export."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

from tests.conftest import REPO, SHARED_DATA  # noqa: F401  (../shared/data: read-only, never copied into the repo)

MT_BENCH = SHARED_DATA / "mt_bench"
TRUTHFULQA = SHARED_DATA / "truthfulqa"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (TRUTHFULQA / "v0").is_dir() or not MT_BENCH.is_dir():
        pytest.skip(f"shared evaluation data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, shared_data) -> Path:
    """A run directory with one checkpoint of a tiny Mixtral-expressible MoE (as in
    tests/train/test_loop.py: real data, real trainer, a few steps)."""
    from moe.config import load_config
    from moe.train import train

    tmp = tmp_path_factory.mktemp("tiny_ckpt")
    cfg = load_config({
        "model": dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=32, max_seq_len=128),
        "router": dict(top_k=2),
        "data": dict(name="text", path=str(shared_data / "corpus" / "tinystories_train_head.txt"), vocab_size=320,
                     max_chars=60_000, cache_dir=str(tmp / "cache"), num_proc=1),
        "train": dict(batch_size=4, seq_len=32, max_steps=8, log_interval=4, eval_interval=8, eval_batches=1,
                      ckpt_interval=8, keep_last=1),
        "optim": dict(lr=3e-3, warmup_steps=2),
        "logger": dict(name="none"),
    })
    run = tmp / "run"
    cached = _trainer_output_cache()
    if cached is not None and (cached / "done").exists():
        shutil.copytree(cached / "run", run)
        return run
    train(cfg, run)
    if cached is not None:  # publish for the next process: a complete copy under its final name, or none
        part = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
        shutil.copytree(run, part / "run")
        (part / "done").touch()
        try:
            os.rename(part, cached)
        except OSError:  # another process published first
            shutil.rmtree(part, ignore_errors=True)
    return run


def _trainer_output_cache():
    """Mutation testing (docs/guides/testing.md) runs these tests in a fresh process per mutant, each of
    which would train this checkpoint again (~10 s). With MOE_TEST_TINY_RUN_CACHE set, a process
    whose mutant is in evaluation code (`eval.*`, which the trainer never imports, so its output
    cannot change) reuses the checkpoint the first such process trained. Otherwise: None."""
    cache = os.environ.get("MOE_TEST_TINY_RUN_CACHE")
    if not cache or not os.environ.get("MUTANT_UNDER_TEST", "").startswith("eval."):
        return None
    return Path(cache)


@pytest.fixture(scope="session")
def tiny(tiny_run):
    """(model, tokenizer, cfg) of the tiny checkpoint, in eval mode on CPU."""
    from moe.loading import load_model
    return load_model(tiny_run)


@pytest.fixture(scope="session")
def tiny_hf(tiny_run, tmp_path_factory) -> Path:
    """The tiny checkpoint exported as an HF Mixtral directory."""
    from moe.hf.commands import export_hf
    return export_hf(tiny_run, tmp_path_factory.mktemp("tiny_hf") / "hf")


def compose(task: str, *overrides: str):
    """The composed Hydra config of `python -m eval task=<task> <overrides>` (no run dir)."""
    from hydra import compose as _compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return _compose(config_name="eval", overrides=[f"task={task}", *overrides])
