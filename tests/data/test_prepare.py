"""`python -m moe.data.prepare` and what a run needs from it: the entry it builds is the one a
run looks up, a distributed run without it fails at once, the cache's place is warned about
when it is under the home directory, and `num_proc` defaults to the usable cores."""

import logging
import os
import time

import pytest

from moe.config import Config, DataConfig
from moe.data import prepare_data
from moe.data.pipeline import cache_root_of, resolve_num_proc
from moe.data.prepare import main
from moe.errors import ConfigError
from moe.train.loop import _prepare_data


def _overrides(corpus, cache):
    return ["data=text", f"data.path={corpus / 'tinyshakespeare.txt'}", "data.vocab_size=320",
            "data.max_chars=20000", f"data.cache_dir={cache}", "data.num_proc=1", "data.shard_tokens=4000"]


def test_prepare_cli_builds_the_entry_a_distributed_run_reads(corpus, tmp_path, capsys):
    cfg = DataConfig(name="text", path=str(corpus / "tinyshakespeare.txt"), vocab_size=320, max_chars=20_000,
                     cache_dir=str(tmp_path / "cache"), num_proc=1, shard_tokens=4000)
    run_cfg = Config(data=cfg)
    t = time.perf_counter()
    with pytest.raises(ConfigError, match=r"prepared data for these data.\* settings is missing .* not there\); "
                                          r"distributed runs only read prepared data: run `python -m moe.data.prepare"):
        _prepare_data(run_cfg, None, distributed=True)
    assert time.perf_counter() - t < 5  # no waiting on another rank
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # nothing was built

    assert main(_overrides(corpus, tmp_path / "cache")) == 0
    out = capsys.readouterr().out
    prep = _prepare_data(run_cfg, None, distributed=True)  # now found, read only
    assert prep.cache_hit and f"prepared: {prep.cache_dir}" in out
    assert f"train: {prep.n_train_tokens:,} tokens in {len(prep.train_paths)} shard(s)" in out
    assert len(prep.train_paths) == -(-prep.n_train_tokens // 4000)
    assert main(_overrides(corpus, tmp_path / "cache")) == 0 and "cache hit: " in capsys.readouterr().out


def test_prepare_cli_errors_are_one_line(capsys):
    assert main(["data=text", "data.path=/nonexistent/corpus.txt"]) == 2
    assert "data.path='/nonexistent/corpus.txt' does not exist" in capsys.readouterr().err


def test_cache_under_home_is_warned_about(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with caplog.at_level(logging.WARNING, logger="moe.data.pipeline"):
        cache_root_of(DataConfig(cache_dir="~/.cache/moe-lab/data"))
        assert "is under the home directory" in caplog.text
        caplog.clear()
        cache_root_of(DataConfig(cache_dir=str(tmp_path / "scratch")))
        assert caplog.text == ""


def test_num_proc_defaults_to_the_usable_cores():
    assert DataConfig().num_proc is None
    assert resolve_num_proc(None) == len(os.sched_getaffinity(0)) and resolve_num_proc(3) == 3
