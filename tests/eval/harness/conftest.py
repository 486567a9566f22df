"""A randomly initialised small moe-lab checkpoint (byte-level BPE tokenizer) and its HF export:
the same weights for the `moe_lab` and the harness's `hf` back-ends. The harness never reaches
the network in these tests (its tasks are the local ones of tests/eval/lm_eval_tasks/)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

LOCAL_TASKS = Path(__file__).resolve().parents[1] / "lm_eval_tasks"
TASKS = ["moe_lab_mc", "moe_lab_rolling", "moe_lab_gen"]
CORPUS = "the quick brown fox jumps over the lazy dog. a cat sat on the mat and the dog ran to the park.\n"


@pytest.fixture(scope="session")
def harness_ckpt(tmp_path_factory) -> Path:
    from moe.data import Tokenizer
    from tests.hf_fixtures import family_checkpoint

    tok = Tokenizer.train([CORPUS * 40], vocab_size=300)
    return family_checkpoint(tmp_path_factory.mktemp("harness_run"), tok, max_seq_len=64)


@pytest.fixture(scope="session")
def harness_hf(harness_ckpt, tmp_path_factory) -> Path:
    from moe.hf.commands import export_hf

    return export_hf(harness_ckpt, tmp_path_factory.mktemp("harness_hf") / "hf")


@pytest.fixture(scope="session")
def local_tasks():
    from eval.harness.run import task_manager

    return task_manager([str(LOCAL_TASKS)], include_defaults=False)
