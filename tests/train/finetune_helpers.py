"""Tiny fine-tuning runs for the train.init_from tests: a corpus of the word tokenizer's words
(tests/hf_fixtures.py), Hydra-composed configs, and the command line passed on as the job's
overrides (what train.py does), so `model.*` overrides are checked as on the command line."""

from __future__ import annotations

from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from moe.config import Config, load_config
from moe.train import JobInfo, train
from tests.conftest import REPO
from tests.hf_fixtures import WORDS

BASE = ["data=text", "data.num_proc=1", "train.batch_size=4", "train.seq_len=16", "train.log_interval=1",
        "train.eval_batches=1", "train.peak_flops=1e9", "logger=none"]


def word_corpus(directory: Path, n_docs: int = 30) -> Path:
    """Documents of 50-80 random words the fixture tokenizer knows (~2k tokens)."""
    path = Path(directory) / "words.txt"
    if not path.exists():
        g = torch.Generator().manual_seed(0)
        docs = [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (int(n),), generator=g))
                for n in torch.randint(50, 80, (n_docs,), generator=g)]
        path.write_text("\n\n".join(docs), encoding="utf-8")
    return path


def finetune_args(source: Path, corpus: Path, cache: Path, *extra: str, steps: int = 3) -> list[str]:
    return [f"train.init_from={source}", f"data.path={corpus}", f"data.cache_dir={cache}", *BASE,
            f"train.max_steps={steps}", f"train.eval_interval={steps}", f"train.ckpt_interval={steps}", *extra]


def composed(args: list[str]) -> Config:
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return load_config(compose(config_name="config", overrides=args))


def run(args: list[str], run_dir: Path) -> dict:
    """`python train.py <args>` in-process: the composed config, the args as the job's overrides."""
    return train(composed(args), run_dir, JobInfo(overrides=list(args)))
