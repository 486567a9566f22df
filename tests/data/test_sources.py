"""Raw text sources: pystdlib, local .txt/.jsonl/.json/.parquet files, and their config errors."""

import json
import sysconfig
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from moe.config import DataConfig
from moe.errors import ConfigError
from moe.data.sources import load_source, resolve_paths, source_identity, truncate_chars


def _text_cfg(path, tmp_path, **kw) -> DataConfig:
    return DataConfig(name="text", path=path, cache_dir=str(tmp_path / "cache"), **kw)


def _load(cfg, tmp_path):
    return load_source(cfg, hf_cache_dir=str(tmp_path / "hf"))


# --------------------------------------------------------------------------- pystdlib


def test_pystdlib_has_many_documents_including_pydoc_topics():
    from pydoc_data.topics import topics

    ds = load_source(DataConfig(name="pystdlib"))
    texts = ds["text"]
    assert ds.column_names == ["text"]
    assert len(texts) > 300  # hundreds of modules plus the topics
    assert topics["assert"] in texts  # a pydoc topic is a document of its own
    assert any(t.startswith('"""Record of phased-in incompatible language changes.') for t in texts)  # __future__.py
    assert all(texts)
    # Test suites are skipped: no file under a test/ or tests/ directory is a document.
    root = Path(sysconfig.get_paths()["stdlib"])
    test_files = sorted(root.glob("*/test*/test_*.py"))[:20] + sorted(root.glob("test/test_*.py"))[:20]
    texts_set = set(texts)
    assert not any(f.read_text(encoding="utf-8", errors="replace") in texts_set for f in test_files)


def test_pystdlib_is_deterministic_and_capped_by_max_chars():
    a = load_source(DataConfig(name="pystdlib", max_chars=100_000))["text"]
    b = load_source(DataConfig(name="pystdlib", max_chars=100_000))["text"]
    assert a == b
    assert sum(map(len, a)) == 100_000
    assert len(a) > 1


# --------------------------------------------------------------------------- local files


def test_txt_file_is_one_document(corpus, tmp_path):
    path = corpus / "tinystories_sample.txt"
    ds = _load(_text_cfg(str(path), tmp_path), tmp_path)
    assert ds["text"] == [path.read_text(encoding="utf-8")]


def test_glob_and_list_paths_keep_order(corpus, tmp_path):
    ds = _load(_text_cfg(str(corpus / "tinystories_*.txt"), tmp_path), tmp_path)
    names = ["tinystories_sample.txt", "tinystories_train_head.txt", "tinystories_valid_head.txt"]  # sorted
    assert ds["text"] == [(corpus / n).read_text(encoding="utf-8") for n in names]

    listed = [str(corpus / names[2]), str(corpus / names[0]), str(corpus / names[2])]  # repeat kept once
    ds = _load(_text_cfg(OmegaConf.create(listed), tmp_path), tmp_path)  # a Hydra ListConfig
    assert ds["text"] == [(corpus / n).read_text(encoding="utf-8") for n in (names[2], names[0])]


def test_tilde_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "doc.txt").write_text("home text", encoding="utf-8")
    assert resolve_paths("~/doc.txt") == [(tmp_path / "doc.txt").resolve()]


def test_jsonl_uses_text_field(tmp_path):
    rows = [{"id": i, "story": f"story number {i} ✨"} for i in range(5)]
    path = tmp_path / "stories.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows), encoding="utf-8")
    ds = _load(_text_cfg(str(path), tmp_path, text_field="story"), tmp_path)
    assert ds.column_names == ["text"]
    assert ds["text"] == [r["story"] for r in rows]


def test_parquet_uses_text_field(tmp_path):
    pd = pytest.importorskip("pandas")
    path = tmp_path / "docs.parquet"
    pd.DataFrame({"body": ["first doc", "second\ndoc", "third 🌍"], "n": [1, 2, 3]}).to_parquet(path)
    ds = _load(_text_cfg(str(path), tmp_path, text_field="body"), tmp_path)
    assert ds["text"] == ["first doc", "second\ndoc", "third 🌍"]


def test_mixed_extensions_in_one_list(corpus, tmp_path):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text(json.dumps({"text": "from jsonl"}) + "\n", encoding="utf-8")
    txt = corpus / "tinystories_sample.txt"
    ds = _load(_text_cfg([str(txt), str(jsonl)], tmp_path), tmp_path)
    assert ds["text"] == [txt.read_text(encoding="utf-8"), "from jsonl"]


def test_max_chars_cuts_the_last_document(corpus, tmp_path):
    ds = _load(_text_cfg(str(corpus / "tinystories_*.txt"), tmp_path, max_chars=5000), tmp_path)
    first = (corpus / "tinystories_sample.txt").read_text(encoding="utf-8")
    second = (corpus / "tinystories_train_head.txt").read_text(encoding="utf-8")
    assert ds["text"] == [first, second[: 5000 - len(first)]]
    assert truncate_chars(ds, 10**9)["text"] == ds["text"]


# --------------------------------------------------------------------------- errors


def test_errors_name_the_field(corpus, tmp_path):
    with pytest.raises(ConfigError, match="data.path is required"):
        _load(_text_cfg(None, tmp_path), tmp_path)
    with pytest.raises(ConfigError, match=r"data.path='.*nope\.txt' does not exist"):
        _load(_text_cfg(str(tmp_path / "nope.txt"), tmp_path), tmp_path)
    with pytest.raises(ConfigError, match=r"data.path='.*\*\.txt' matched no files"):
        _load(_text_cfg(str(tmp_path / "*.txt"), tmp_path), tmp_path)
    with pytest.raises(ConfigError, match="is a directory"):
        _load(_text_cfg(str(corpus), tmp_path), tmp_path)
    bad = tmp_path / "data.csv"
    bad.write_text("text\nhello\n")
    allowed = r"'.csv'.*allowed: \['.json', '.jsonl', '.parquet', '.txt'\]"
    with pytest.raises(ConfigError, match=r"data.path: unsupported file extension " + allowed):
        _load(_text_cfg([str(corpus / "tinystories_sample.txt"), str(bad)], tmp_path), tmp_path)


def test_missing_text_field_lists_the_columns(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"story": "x", "id": 1}) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"data.text_field='text' is not a column.*columns: \['story', 'id'\]"):
        _load(_text_cfg(str(path), tmp_path), tmp_path)
    with pytest.raises(ConfigError, match=r"data.text_field='id'.*not strings"):
        _load(_text_cfg(str(path), tmp_path, text_field="id"), tmp_path)


def test_source_identity_tracks_file_changes(tmp_path):
    path = tmp_path / "doc.txt"
    path.write_text("version one", encoding="utf-8")
    cfg = _text_cfg(str(path), tmp_path)
    before = source_identity(cfg)
    assert before == source_identity(cfg)
    path.write_text("version two, longer", encoding="utf-8")
    assert source_identity(cfg) != before
    stdlib = source_identity(DataConfig(name="pystdlib"))
    assert stdlib["name"] == "pystdlib" and stdlib["stdlib"]


def test_hub_source_selects_text_field(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, config=None, split=None, **kw):  # no network in tests
        calls.append((name, config, split))
        return datasets.Dataset.from_dict({"story": ["a", "b"], "n": [1, 2]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    cfg = DataConfig(name="hub", hub_name="org/stories", hub_config="en", hub_split="validation", text_field="story")
    assert load_source(cfg)["text"] == ["a", "b"]
    assert calls == [("org/stories", "en", "validation")]
    with pytest.raises(ConfigError, match="data.hub_name is required"):
        load_source(DataConfig(name="hub"))
