"""Sharded token files: the shards of a split are exactly the single-file stream cut in pieces,
the batches drawn from them are the same, and an entry in the pre-shard layout still loads."""

import json

import numpy as np
import pytest

from moe.config import DataConfig
from moe.data import TokenBatcher, eval_batches, prepare_data
from moe.data.shards import ShardedTokens, ShardWriter


def test_sharded_tokens_index_like_one_array(tmp_path):
    stream_N = np.arange(1000, dtype=np.uint16) * 7
    w = ShardWriter(tmp_path, "train", np.uint16, shard_tokens=300)
    for piece in np.split(stream_N, [5, 450, 451, 999]):  # writes that straddle shard ends
        w.write(piece)
    shards = w.finish()
    assert [n for _, n in shards] == [300, 300, 300, 100]
    tokens = ShardedTokens([tmp_path / name for name, _ in shards], np.uint16)
    assert len(tokens) == 1000 and np.array_equal(np.asarray(tokens), stream_N)
    idx = np.array([[0, 299, 300, 301], [599, 600, 998, 999]])  # windows across shard boundaries
    assert np.array_equal(tokens[idx], stream_N[idx])
    assert np.array_equal(tokens[290:310], stream_N[290:310])
    with pytest.raises(IndexError):
        tokens[np.array([1000])]
    assert not list(tmp_path.glob(".*.tmp"))  # every shard moved into place


def test_many_shards_give_the_same_tokens_and_batches(corpus, tmp_path):
    cfg = dict(name="text", path=str(corpus / "tinyshakespeare.txt"), vocab_size=320, max_chars=40_000, num_proc=1)
    one = prepare_data(DataConfig(**cfg), cache_root=str(tmp_path / "one"))
    many = prepare_data(DataConfig(**cfg, shard_tokens=4096), cache_root=str(tmp_path / "many"))
    assert one.cache_dir.name == many.cache_dir.name  # the shard size is not part of the key
    assert len(one.train_paths) == 1 and len(many.train_paths) == -(-one.n_train_tokens // 4096) > 3
    meta = json.loads((many.cache_dir / "meta.json").read_text())
    assert [name for name, _ in meta["shards"]["train"]] == [p.name for p in many.train_paths]
    assert sum(n for _, n in meta["shards"]["train"]) == many.n_train_tokens
    reference = np.asarray(one.train_tokens())  # the single file: the stream before sharding
    assert np.array_equal(np.asarray(many.train_tokens()), reference)
    a, b = (TokenBatcher(p.train_tokens(), 4, 32, seed=3, rank=1, world_size=2) for p in (one, many))
    for _ in range(5):
        for x, y in zip(a.next_batch(), b.next_batch()):
            assert np.array_equal(x.numpy(), y.numpy())
    for (x1, y1), (x2, y2) in zip(eval_batches(one.val_tokens(), 2, 32, 2), eval_batches(many.val_tokens(), 2, 32, 2)):
        assert np.array_equal(x1.numpy(), x2.numpy()) and np.array_equal(y1.numpy(), y2.numpy())
    again = prepare_data(DataConfig(**cfg, shard_tokens=4096), cache_root=str(tmp_path / "many"))
    assert again.cache_hit
    many.train_paths[2].write_bytes(b"\0\0")  # a damaged shard: the entry is rebuilt
    assert not prepare_data(DataConfig(**cfg, shard_tokens=4096), cache_root=str(tmp_path / "many")).cache_hit


def test_an_entry_in_the_single_file_layout_still_loads(corpus, tmp_path):
    cfg = DataConfig(name="text", path=str(corpus / "tinyshakespeare.txt"), vocab_size=320, max_chars=20_000,
                     num_proc=1)
    new = prepare_data(cfg, cache_root=str(tmp_path))
    entry, tokens = new.cache_dir, np.asarray(new.train_tokens()).copy()
    # Rewrite it as the layout before shards: train.bin / val.bin and no "shards" in meta.json.
    meta = json.loads((entry / "meta.json").read_text())
    for split, legacy in (("train", "train.bin"), ("val", "val.bin")):
        (entry / meta["shards"][split][0][0]).rename(entry / legacy)
    del meta["shards"]
    (entry / "meta.json").write_text(json.dumps(meta))
    old = prepare_data(cfg, cache_root=str(tmp_path))
    assert old.cache_hit and old.train_path == entry / "train.bin"
    assert np.array_equal(np.asarray(old.train_tokens()), tokens)
