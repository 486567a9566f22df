"""`data.streaming=true`: the local-file road through `load_dataset(..., streaming=True)`, the same
code the hub road takes. With the same tokenizer it writes exactly the tokens of the in-memory
pipeline (same per-document split, same order), for many documents and for a single one."""

import json

import numpy as np
import pytest

from moe.config import DataConfig
from moe.data import prepare_data
from moe.data.split import split_indices
from moe.errors import ConfigError


@pytest.fixture(scope="module")
def tok_file(small_tokenizer, tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    small_tokenizer.save(d)
    return str(d / "tokenizer.json")


def _both(tmp_path, **kw):
    base = dict(name="text", num_proc=1, val_fraction=0.1, **kw)
    mem = prepare_data(DataConfig(**base), cache_root=str(tmp_path / "mem"))
    stream = prepare_data(DataConfig(**base, streaming=True, shard_tokens=5000), cache_root=str(tmp_path / "stream"))
    return mem, stream


def test_stream_of_jsonl_documents_equals_the_in_memory_pipeline(corpus, tmp_path, tok_file):
    paragraphs = [p for p in (corpus / "tinystories_train_head.txt").read_text().split("\n\n") if p.strip()][:400]
    path = tmp_path / "stories.jsonl"
    path.write_text("".join(json.dumps({"story": p}) + "\n" for p in paragraphs))
    mem, stream = _both(tmp_path, path=str(path), text_field="story", tokenizer_path=tok_file, max_chars=60_000)
    assert mem.cache_dir.name != stream.cache_dir.name  # never the same entry
    assert len(stream.train_paths) > 1  # written in shards as it streams
    for a, b in ((mem.train_tokens(), stream.train_tokens()), (mem.val_tokens(), stream.val_tokens())):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    n_docs = sum(1 for _ in range(len(paragraphs)) if sum(map(len, paragraphs[:_ + 1])) <= 60_000) + 1
    train_idx, val_idx = split_indices(n_docs, 0.1)
    meta = stream.meta
    assert (meta["n_train_docs"], meta["n_val_docs"]) == (len(train_idx), len(val_idx))


def test_stream_of_one_document_is_cut_head_and_tail(corpus, tmp_path, tok_file):
    mem, stream = _both(tmp_path, path=str(corpus / "tinyshakespeare.txt"), tokenizer_path=tok_file,
                        max_chars=30_000)
    assert np.array_equal(np.asarray(mem.train_tokens()), np.asarray(stream.train_tokens()))
    assert np.array_equal(np.asarray(mem.val_tokens()), np.asarray(stream.val_tokens()))


def test_stream_trains_its_own_tokenizer_and_refuses_an_empty_split(corpus, tmp_path):
    cfg = DataConfig(name="text", path=str(corpus / "tinystories_*.txt"), vocab_size=320, max_chars=30_000,
                     streaming=True, num_proc=1)
    prep = prepare_data(cfg, cache_root=str(tmp_path))
    assert prep.vocab_size == 320
    # The documents (one per .txt file, sorted, capped at max_chars) come back exactly (byte-level BPE).
    docs, total = [], 0
    for f in sorted(corpus.glob("tinystories_*.txt")):
        text = f.read_text(encoding="utf-8")[: 30_000 - total]
        if text:
            docs.append(text)
        total += len(text)
    got = []
    for tokens in (prep.train_tokens(), prep.val_tokens()):
        ids = np.asarray(tokens)
        ends = np.flatnonzero(ids == prep.tokenizer.eos_id)
        got += [prep.tokenizer.decode(ids[s:e].tolist()) for s, e in zip(np.r_[0, ends[:-1] + 1], ends)]
    assert sorted(got) == sorted(docs) and len(docs) >= 2
    two_docs = DataConfig(name="text", path=str(corpus / "tinystories_*.txt"), vocab_size=320, max_chars=30_000,
                          streaming=True, num_proc=1, val_fraction=0.001)
    with pytest.raises(ConfigError, match="the val split of the stream is empty"):
        prepare_data(two_docs, cache_root=str(tmp_path))
