"""`python -m moe.data.prepare [data=<source>] [data.<field>=<value> ...]`: prepare the data of a
run as a step of its own, before training (required before a distributed run, which only reads).

Takes the same `data=...` / `data.*` overrides as train.py (any other override of train.py is
accepted and ignored, so one list of overrides serves both), builds the cache entry the run
will look up, and prints where it is and what it holds. Examples:

    python -m moe.data.prepare data=text 'data.path=/scratch/corpus/*.jsonl' data.vocab_size=32768
    python -m moe.data.prepare data=hub data.hub_name=roneneldan/TinyStories data.streaming=true \\
        data.cache_dir=/scratch/$USER/moe-lab/data
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

from moe import cli
from moe.config import load_config
from moe.data.pipeline import prepare_data

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def compose_config(overrides: Sequence[str]):
    from hydra import compose, initialize_config_dir  # Hydra is only needed by this command line

    if not CONFIG_DIR.is_dir():
        raise FileNotFoundError(f"{CONFIG_DIR}: the configs of a moe-lab checkout (install it with pip install -e)")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return load_config(compose("config", overrides=list(overrides)))


@cli.guarded
def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = compose_config(argv)
    prep = prepare_data(cfg.data)
    shards = prep.meta.get("shards", {})
    print(f"{'cache hit' if prep.cache_hit else 'prepared'}: {prep.cache_dir}")
    print(f"  train: {prep.n_train_tokens:,} tokens in {len(shards.get('train', [1]))} shard(s)")
    print(f"  val:   {prep.n_val_tokens:,} tokens in {len(shards.get('val', [1]))} shard(s)")
    print(f"  tokenizer: {prep.tokenizer_dir} ({prep.vocab_size} tokens), token dtype {prep.dtype}")
    return 0


if __name__ == "__main__":
    cli.check_hydra_overrides(CONFIG_DIR, "config", program="python -m moe.data.prepare")  # a typo: one line, exit 2
    sys.exit(main())
