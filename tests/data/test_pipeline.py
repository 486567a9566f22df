"""prepare_data end to end: split, tokenise, flat token files, and the on-disk cache."""

import json

import numpy as np
import pytest

from moe.config import DataConfig
from moe.errors import ConfigError
from moe.data import pipeline, prepare_data
from moe.data.split import split_indices, split_single_document


@pytest.fixture(scope="module")
def paragraphs(corpus) -> list[str]:
    """~1200 short TinyStories paragraphs: a corpus of many small documents."""
    text = (corpus / "tinystories_train_head.txt").read_text(encoding="utf-8")
    return [p for p in text.split("\n\n") if p.strip()]


@pytest.fixture()
def jsonl_corpus(tmp_path, paragraphs):
    path = tmp_path / "stories.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i, p in enumerate(paragraphs):
            f.write(json.dumps({"story": p, "id": i}) + "\n")
    return path


def _cfg(path, **kw) -> DataConfig:
    kw.setdefault("vocab_size", 512)
    return DataConfig(name="text", path=str(path), text_field="story", **kw)


def _docs_of(tokens: np.ndarray, tokenizer) -> list[str]:
    """Split a token file back into its documents (each ends with <|eos|>)."""
    eos_at = np.flatnonzero(tokens == tokenizer.eos_id)
    assert eos_at[-1] == len(tokens) - 1  # the stream ends with a document boundary
    starts = np.concatenate([[0], eos_at[:-1] + 1])
    return [tokenizer.decode(tokens[s:e]) for s, e in zip(starts, eos_at)]


def test_prepare_splits_tokenises_and_hits_cache(jsonl_corpus, paragraphs, tmp_path, monkeypatch):
    cfg = _cfg(jsonl_corpus, val_fraction=0.1)
    first = prepare_data(cfg, cache_root=str(tmp_path / "cache"))
    assert not first.cache_hit
    assert first.vocab_size == 512 and first.dtype == "uint16"
    train, val = first.train_tokens(), first.val_tokens()
    assert (len(train), len(val)) == (first.n_train_tokens, first.n_val_tokens)
    assert not train.flags.writeable

    # The files hold exactly the split's documents, in order, each followed by <|eos|>.
    train_idx, val_idx = split_indices(len(paragraphs), 0.1)
    assert _docs_of(train, first.tokenizer) == [paragraphs[i] for i in train_idx]
    assert _docs_of(val, first.tokenizer) == [paragraphs[i] for i in val_idx]

    meta = json.loads((first.cache_dir / "meta.json").read_text())
    assert meta["n_train_docs"] == len(train_idx) and meta["n_val_docs"] == len(val_idx)
    assert (first.tokenizer_dir / "tokenizer_config.json").is_file()
    assert first.cache_dir.parent == (tmp_path / "cache").resolve()

    # Second call: loaded from the cache without tokenising anything.
    def no_tokenising(*a, **k):
        raise AssertionError("a cache hit must not re-tokenise")

    monkeypatch.setattr(pipeline, "_tokenize_into", no_tokenising)
    monkeypatch.setattr(pipeline.Tokenizer, "train", no_tokenising)
    second = prepare_data(cfg, cache_root=str(tmp_path / "cache"))
    assert second.cache_hit
    assert second.train_path == first.train_path
    assert np.array_equal(second.train_tokens(), train) and np.array_equal(second.val_tokens(), val)
    assert second.tokenizer.encode("Lily smiled.") == first.tokenizer.encode("Lily smiled.")


def test_same_settings_rebuild_identical_files(jsonl_corpus, tmp_path):
    a = prepare_data(_cfg(jsonl_corpus), cache_root=str(tmp_path / "a"))
    b = prepare_data(_cfg(jsonl_corpus), cache_root=str(tmp_path / "b"))
    assert a.cache_dir.name == b.cache_dir.name  # the key does not depend on the cache location
    assert a.train_path.read_bytes() == b.train_path.read_bytes()
    assert a.val_path.read_bytes() == b.val_path.read_bytes()


def test_settings_change_the_cache_key(jsonl_corpus, tmp_path):
    root = str(tmp_path / "cache")
    base = prepare_data(_cfg(jsonl_corpus), cache_root=root)
    bigger = prepare_data(_cfg(jsonl_corpus, vocab_size=600), cache_root=root)
    assert bigger.cache_dir != base.cache_dir and not bigger.cache_hit
    assert bigger.vocab_size == 600 and bigger.n_train_tokens < base.n_train_tokens  # more merges, fewer tokens
    # num_proc does not change the files, so it does not change the key.
    assert prepare_data(_cfg(jsonl_corpus, num_proc=1), cache_root=root).cache_hit
    assert not prepare_data(_cfg(jsonl_corpus, val_fraction=0.2), cache_root=root).cache_hit
    # Editing the source file invalidates it too (size / mtime are in the key).
    with open(jsonl_corpus, "a", encoding="utf-8") as f:
        f.write(json.dumps({"story": "One more story.", "id": -1}) + "\n")
    edited = prepare_data(_cfg(jsonl_corpus), cache_root=root)
    assert edited.cache_dir != base.cache_dir and not edited.cache_hit
    docs = _docs_of(edited.train_tokens(), edited.tokenizer) + _docs_of(edited.val_tokens(), edited.tokenizer)
    assert "One more story." in docs  # the new text, not a stale copy of the old file


def test_incomplete_cache_entry_is_rebuilt(jsonl_corpus, tmp_path):
    root = str(tmp_path / "cache")
    good = prepare_data(_cfg(jsonl_corpus), cache_root=root)
    train_bytes = good.train_path.read_bytes()

    (good.cache_dir / "meta.json").unlink()  # as if the build had been killed before finishing
    again = prepare_data(_cfg(jsonl_corpus), cache_root=root)
    assert not again.cache_hit and again.train_path.read_bytes() == train_bytes

    with open(again.train_path, "r+b") as f:  # a truncated token file with an intact meta.json
        f.truncate(10)
    fixed = prepare_data(_cfg(jsonl_corpus), cache_root=root)
    assert not fixed.cache_hit and fixed.train_path.read_bytes() == train_bytes
    assert not list(fixed.cache_dir.glob(".*.tmp")) and not list(fixed.cache_dir.glob("ids-*.arrow"))

    (fixed.tokenizer_dir / "tokenizer.json").write_text("not json")  # damaged, sizes still fine
    healed = prepare_data(_cfg(jsonl_corpus), cache_root=root)
    assert not healed.cache_hit and healed.train_path.read_bytes() == train_bytes


def test_multiprocess_tokenising_matches_single_process(jsonl_corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "MIN_ROWS_PER_PROC", 1)  # force the 2-worker map on a small corpus
    one = prepare_data(_cfg(jsonl_corpus, num_proc=1), cache_root=str(tmp_path / "one"))
    two = prepare_data(_cfg(jsonl_corpus, num_proc=2), cache_root=str(tmp_path / "two"))
    assert one.train_path.read_bytes() == two.train_path.read_bytes()
    assert one.val_path.read_bytes() == two.val_path.read_bytes()


def test_txt_glob_pipeline(corpus, tmp_path):
    cfg = DataConfig(name="text", path=str(corpus / "tinystories_*.txt"), vocab_size=512, max_chars=60_000)
    prep = prepare_data(cfg, cache_root=str(tmp_path))
    docs = _docs_of(prep.train_tokens(), prep.tokenizer) + _docs_of(prep.val_tokens(), prep.tokenizer)
    sample = (corpus / "tinystories_sample.txt").read_text(encoding="utf-8")
    head = (corpus / "tinystories_train_head.txt").read_text(encoding="utf-8")
    assert sorted(docs) == sorted([sample, head[: 60_000 - len(sample)]])  # 2 documents, one each side


def test_single_document_is_split_head_and_tail(corpus, tmp_path):
    cfg = DataConfig(name="text", path=str(corpus / "tinyshakespeare.txt"), vocab_size=512,
                     max_chars=40_000, val_fraction=0.1)
    prep = prepare_data(cfg, cache_root=str(tmp_path))
    (train_doc,) = _docs_of(prep.train_tokens(), prep.tokenizer)
    (val_doc,) = _docs_of(prep.val_tokens(), prep.tokenizer)
    text = (corpus / "tinyshakespeare.txt").read_text(encoding="utf-8")[:40_000]
    assert train_doc + val_doc == text
    assert 0.05 < len(val_doc) / len(text) < 0.15 and train_doc.endswith("\n")


def test_pystdlib_pipeline(tmp_path):
    cfg = DataConfig(name="pystdlib", vocab_size=512, max_chars=300_000)
    prep = prepare_data(cfg, cache_root=str(tmp_path))
    meta = json.loads((prep.cache_dir / "meta.json").read_text())
    assert meta["n_train_docs"] > 5 and meta["n_val_docs"] >= 1
    text = prep.tokenizer.decode(prep.train_tokens()[:5000])
    assert "def " in text and "import " in text
    assert prepare_data(cfg, cache_root=str(tmp_path)).cache_hit


def test_existing_tokenizer_is_reused(jsonl_corpus, tmp_path):
    trained = prepare_data(_cfg(jsonl_corpus), cache_root=str(tmp_path / "a"))
    reused = prepare_data(_cfg(jsonl_corpus, vocab_size=9999, tokenizer_path=str(trained.tokenizer_dir)),
                          cache_root=str(tmp_path / "b"))
    assert reused.vocab_size == trained.vocab_size == 512  # the file's size wins over data.vocab_size
    assert reused.train_path.read_bytes() == trained.train_path.read_bytes()
    with pytest.raises(ConfigError, match="data.tokenizer_path='.*missing'"):
        prepare_data(_cfg(jsonl_corpus, tokenizer_path=str(tmp_path / "missing")), cache_root=str(tmp_path))
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    with pytest.raises(ConfigError, match="data.tokenizer_path=.*could not be used"):
        prepare_data(_cfg(jsonl_corpus, tokenizer_path=str(junk)), cache_root=str(tmp_path))


def test_config_errors(tmp_path, jsonl_corpus):
    with pytest.raises(ConfigError, match="data.vocab_size=200"):
        prepare_data(_cfg(jsonl_corpus, vocab_size=200), cache_root=str(tmp_path))
    with pytest.raises(ConfigError, match="data.val_fraction=1.5"):
        prepare_data(_cfg(jsonl_corpus, val_fraction=1.5), cache_root=str(tmp_path))
    with pytest.raises(ConfigError, match="matched no files"):
        prepare_data(_cfg(tmp_path / "none*.jsonl"), cache_root=str(tmp_path))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match="data.path: could not read"):
        prepare_data(_cfg(empty), cache_root=str(tmp_path))


# --------------------------------------------------------------------------- split


def test_split_is_disjoint_deterministic_and_near_the_fraction():
    train, val = split_indices(10_000, 0.05)
    assert np.intersect1d(train, val).size == 0
    assert np.array_equal(np.union1d(train, val), np.arange(10_000))
    assert 400 < len(val) < 600
    again_train, again_val = split_indices(10_000, 0.05)
    assert np.array_equal(train, again_train) and np.array_equal(val, again_val)
    # A document's side depends only on its index: a longer corpus keeps the earlier choices.
    longer_train, _ = split_indices(20_000, 0.05)
    assert np.array_equal(longer_train[longer_train < 10_000], train)


def test_split_small_corpora_keep_both_sides():
    for n in range(2, 30):
        train, val = split_indices(n, 0.01)
        assert len(train) >= 1 and len(val) >= 1 and len(train) + len(val) == n
        train, val = split_indices(n, 0.99)
        assert len(train) >= 1 and len(val) >= 1
    with pytest.raises(ConfigError, match="1 document"):
        split_indices(1, 0.1)
    head, tail = split_single_document("line one\nline two\nline three\n", 0.3)
    assert head + tail == "line one\nline two\nline three\n" and head.endswith("\n") and tail


def test_token_dtype():
    assert pipeline.token_dtype(4096) == np.uint16
    assert pipeline.token_dtype(65535) == np.uint16
    assert pipeline.token_dtype(65536) == np.uint32
