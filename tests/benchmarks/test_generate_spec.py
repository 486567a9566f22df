"""benchmarks/generate_spec.py: `--spec-batch N` runs every engine side (the plain engine too) with
N requests in flight, compares every output with the plain engine's at that batch (a difference is
counted: the benchmark exits 1), reports acceptance (first draft too) and every timed run, and
leaves out the one-prompt-at-a-time HF peers; a bad N is one argparse line naming the option."""

from __future__ import annotations

import argparse
import time

import pytest
import torch

from benchmarks import generate, generate_spec
from moe.engine import LLM
from tests.engine.conftest import ByteTokenizer, build_model

TEXT = "def f(x):\n    return x + 1\n\n" * 30 + "the cat sat on the mat. " * 20


@pytest.fixture(scope="module")
def mtp_model():
    return build_model(260, seed=5, mtp_depth=1)


def spec_args(corpus, batch: int, methods: str = "mtp,ngram") -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    generate_spec.add_arguments(ap)
    args = ap.parse_args(["--speculative", methods, "--spec-batch", str(batch), "--corpus", str(corpus),
                          "--spec-prompts", "3", "--spec-prompt-len", "24", "--spec-max-tokens", "8",
                          "--spec-tokens", "3"])
    args.repeats, args.compile, args.device, args.torch_dtype = 2, False, "cpu", torch.float32
    return args


def timed(fn, repeats, runs=None):
    w, c = time.perf_counter(), time.process_time()
    out = [fn() for _ in range(repeats)][-1]
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    if runs is not None:
        runs.extend(dict(wall_s=wall / repeats, cpu_s=cpu / repeats) for _ in range(repeats))
    return out, wall / repeats, cpu / repeats


@pytest.fixture
def engines(monkeypatch):
    """Every engine the benchmark builds, each with `widest`: the most requests it ran together."""
    built = []
    make = LLM.from_model

    def spy(*a, **kw):
        llm = make(*a, **kw)
        llm.widest = 0
        step = llm.step

        def counted_step():  # the most sequences running together after any step
            events = step()
            llm.widest = max(llm.widest, len(llm.scheduler.running))
            return events
        llm.step = counted_step
        built.append(llm)
        return llm
    monkeypatch.setattr(LLM, "from_model", staticmethod(spy))
    return built


def test_batch_n_runs_every_side_at_n_and_matches_the_plain_engine(mtp_model, tmp_path, engines):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    hf_calls = []
    res, bad = generate_spec.run(spec_args(corpus, 3), mtp_model, ByteTokenizer(), timed, hf_calls.append)
    assert bad == 0 and res["batch"] == 3
    assert [e.widest for e in engines] == [3, 3, 3]  # plain, mtp, ngram: all at batch 3
    assert [e.config.speculative and e.config.speculative.method for e in engines] == [None, "mtp", "ngram"]
    assert hf_calls == []  # no HF peer at batch 3
    for name in ("engine, plain", "engine, mtp", "engine, ngram"):
        r = res[name]
        assert r["identical"] == 3 and len(r["runs"]) == 2 and r["wall_s"] > 0 and r["cpu_s"] > 0
    for name in ("engine, mtp", "engine, ngram"):
        r = res[name]
        assert 0 <= r["first_acceptance_rate"] <= 1 and 0 <= r["acceptance_rate"] <= 1
        # a step that accepts anything accepted its first draft; it accepts at most k = 3
        assert r["first_acceptance_rate"] * 3 >= r["mean_accepted_length"] >= r["first_acceptance_rate"]
    assert res["engine, ngram"]["acceptance_rate"] > 0  # repetitive text: lookup finds drafts


def test_batch_1_keeps_the_hf_peers(mtp_model, tmp_path, engines):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    hf_calls = []
    res, bad = generate_spec.run(spec_args(corpus, 1, "ngram"), mtp_model, ByteTokenizer(), timed, hf_calls.append)
    assert bad == 0 and res["batch"] == 1 and [e.widest for e in engines] == [1, 1]
    assert hf_calls == [mtp_model]  # asked for the HF peer (None here: none run)


def test_an_output_differing_from_the_plain_engine_is_counted(mtp_model, tmp_path, engines, monkeypatch):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    generate_one = LLM.generate

    def corrupt(self, prompts, params=None, **kw):  # the speculative engines' second output changes
        outs = generate_one(self, prompts, params, **kw)
        if self.config.speculative is not None and len(outs) > 1:
            outs[1].token_ids = outs[1].token_ids[:-1] + [outs[1].token_ids[-1] + 1]
        return outs
    monkeypatch.setattr(LLM, "generate", corrupt)
    res, bad = generate_spec.run(spec_args(corpus, 3, "ngram"), mtp_model, ByteTokenizer(), timed, lambda m: None)
    assert bad == 1 and res["engine, ngram"]["identical"] == 2 and res["engine, plain"]["identical"] == 3


@pytest.mark.parametrize("value", ["0", "-2", "eight"])
def test_a_bad_spec_batch_is_one_line_naming_the_option(value, capsys):
    with pytest.raises(SystemExit) as e:
        generate.main(["--speculative", "ngram", "--spec-batch", value])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--spec-batch" in err and "integers >= 1" in err
