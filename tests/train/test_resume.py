"""Exact resume from any step, the whole-config check, the checkpoint's tokenizer, and
non-finite losses (moe/train/loop.py, moe/train/resume.py). Every comparison with the
uninterrupted run goes both ways: no record or key missing, none extra, every value equal."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import random
import shutil

import numpy as np
import pytest
import torch

from moe.checkpoint import latest_checkpoint
from moe.config import field_paths, load_config
from moe.data import Tokenizer
from moe.errors import CheckpointError
from moe.model import Transformer
from moe.train import train
from moe.train.optim import lr_at
from moe.train.resume import (RESUME_EXEMPT, check_resume_config, check_training_state, config_changes,
                              matches_field, rng_state, seed_everything, set_rng_state)
from tests.train.runs import CORPUS, assert_same_records, composed_cfg, read_metrics, strict_records


def test_stops_at_any_step_resume_to_the_uninterrupted_records(reference, tmp_path, caplog):
    """Stops after step 3 (no record there), 6 (a log step) and 8 (log + validation + checkpoint),
    each resumed; before the last resume the data cache's tokenizer is replaced by another one,
    so only a resume that tokenises with the checkpoint's tokenizer can reproduce the run."""
    cache = tmp_path / "cache"
    shutil.copytree(reference.cache, cache)
    run = tmp_path / "run"
    for extra in (["train.stop_after=3"], ["train.resume=auto", "train.stop_after=6"],
                  ["train.resume=auto", "train.stop_after=8"]):
        s = train(composed_cfg(cache, *extra), run)
        assert s["stopped_early"] and latest_checkpoint(run).name == f"step_{s['step']:07d}.pt"
    assert [r["step"] for r in read_metrics(run)] == [0, 2, 4, 6, 8]
    (entry,) = [p for p in cache.iterdir() if (p / "tokenizer").is_dir()]
    Tokenizer.train(["a different corpus, a different tokenizer " * 50], 300).save(entry / "tokenizer")
    caplog.set_level(logging.INFO, logger="moe")
    s = train(composed_cfg(cache, "train.resume=auto"), run)
    assert "tokenising the corpus with the checkpoint's tokenizer" in caplog.text
    assert_same_records(read_metrics(reference.run), read_metrics(run))
    assert s["final_val_loss"] == read_metrics(reference.run)[-1]["val/loss"]


def test_resume_checks_the_whole_config_and_logs_allowed_changes(reference, tmp_path, caplog):
    run = tmp_path / "run"
    train(composed_cfg(reference.cache, "train.stop_after=4"), run)
    with pytest.raises(CheckpointError) as e:
        train(composed_cfg(reference.cache, "train.resume=auto", "train.batch_size=8", "train.seq_len=16",
                           "optim.lr=1e-3", "train.max_steps=20"), run)
    msg = str(e.value)
    for diff in ("optim.lr: checkpoint has 0.003, config has 0.001", "train.batch_size: checkpoint has 4, config has 8",
                 "train.max_steps: checkpoint has 10, config has 20", "train.seq_len: checkpoint has 32, config has 16"):
        assert diff in msg
    assert "train.resume_allow=[optim.lr,train.batch_size,train.max_steps,train.seq_len]" in msg
    # Intervals and the logger are free; an allowed change is logged with the learning rate it moves.
    caplog.set_level(logging.INFO, logger="moe")
    train(composed_cfg(reference.cache, "train.resume=auto", "train.max_steps=20", "train.log_interval=1",
                       "train.resume_allow=[train.max_steps]", "train.stop_after=5"), run)
    cfg = composed_cfg(reference.cache)
    before, after = lr_at(4, cfg.optim, 10), lr_at(4, cfg.optim, 20)
    assert before != after
    assert "resume: train.max_steps changes from 10 to 20 (train.resume_allow)" in caplog.text
    assert f"resume: learning rate at step 4: {before:.4g} before the change, {after:.4g} after" in caplog.text
    info = json.loads((run / "config.json").read_text())["run"]
    assert info["resumes"][-1]["changes"] == ["train.max_steps: checkpoint has 10, config has 20"]
    assert [r["step"] for r in read_metrics(run)] == [0, 2, 4, 5]  # log_interval=1 from the resume on


def test_check_resume_config_lists_each_refused_field_on_its_line_and_logs_the_allowed_ones(tmp_path, caplog):
    """The same check without a run, word for word: one refused field per line; an allowed
    `optim.*` change (not only train.max_steps) logs the learning rate it moves; exempt fields
    that differ are logged as such (the run-control switches are not)."""
    saved = composed_cfg(tmp_path)
    with pytest.raises(CheckpointError) as e:
        check_resume_config(saved, composed_cfg(tmp_path, "optim.lr=1e-3", "train.batch_size=8"), 4, "c.pt")
    assert str(e.value).splitlines() == [
        "checkpoint c.pt was written with another config; a resume continues the same run, so these fields must match:",
        "  optim.lr: checkpoint has 0.003, config has 0.001",
        "  train.batch_size: checkpoint has 4, config has 8",
        "set them back, or allow the change on purpose with train.resume_allow=[optim.lr,train.batch_size]"]
    caplog.set_level(logging.INFO, logger="moe")
    cfg = composed_cfg(tmp_path, "optim.lr=1e-3", "train.log_interval=1", "train.resume_allow=[optim.lr]",
                       "logger.project=elsewhere")
    assert [str(c) for c in check_resume_config(saved, cfg, 4, "c.pt")] == [
        "optim.lr: checkpoint has 0.003, config has 0.001"]
    before, after = lr_at(4, saved.optim, saved.train.max_steps), lr_at(4, cfg.optim, cfg.train.max_steps)
    assert before != after
    assert [r.getMessage() for r in caplog.records if r.name == "moe"] == [
        "resume: optim.lr changes from 0.003 to 0.001 (train.resume_allow)",
        f"resume: learning rate at step 4: {before:.4g} before the change, {after:.4g} after",
        f"resume: train.log_interval is 1 (checkpoint: {saved.train.log_interval})"]


def test_a_section_set_where_the_checkpoint_has_none_is_a_change(tmp_path):
    """Adding RoPE scaling on resume (None in the checkpoint, a section now): every key of the
    section is compared, also those only one side has (rules out comparing the common keys only)."""
    saved = composed_cfg(tmp_path)
    cfg = composed_cfg(tmp_path, "model.rope_scaling={rope_type: yarn, factor: 4.0, original_max_position_embeddings: 256}")
    assert [str(c) for c in config_changes(saved, cfg)] == [
        "model.rope_scaling.factor: checkpoint has None, config has 4.0",
        "model.rope_scaling.original_max_position_embeddings: checkpoint has None, config has 256",
        "model.rope_scaling.rope_type: checkpoint has None, config has 'yarn'"]
    assert [str(c) for c in config_changes(cfg, saved)] == [
        "model.rope_scaling.factor: checkpoint has 4.0, config has None",
        "model.rope_scaling.original_max_position_embeddings: checkpoint has 256, config has None",
        "model.rope_scaling.rope_type: checkpoint has 'yarn', config has None"]


def test_changed_data_is_refused(reference, tmp_path):
    corpus = tmp_path / "corpus.txt"
    text = CORPUS.read_text()
    corpus.write_text(text[:60_000])
    args = [f"data.path={corpus}", "train.stop_after=1", "train.eval_batches=1"]
    run = tmp_path / "run"
    train(composed_cfg(tmp_path / "cache", *args), run)
    corpus.write_text(text[:70_000])  # the same path, more text
    with pytest.raises(CheckpointError, match="the data changed since the checkpoint.*train.resume_allow=\\[data\\]"):
        train(composed_cfg(tmp_path / "cache", *args, "train.resume=auto", "train.stop_after=2"), run)
    s = train(composed_cfg(tmp_path / "cache", *args, "train.resume=auto", "train.stop_after=2",
                           "train.resume_allow=[data]"), run)
    assert s["step"] == 2


def test_the_fields_a_resume_may_change():
    """Exactly these differ freely (docs/guides/training.md, "Resume"); every other field of the schema is checked."""
    exempt = [f for f in field_paths() if matches_field(f, RESUME_EXEMPT)]
    assert sorted(exempt) == sorted([
        "train.stop_after", "train.log_interval", "train.eval_interval", "train.ckpt_interval", "train.keep_last",
        "train.resume", "train.resume_allow", "train.overwrite", "train.stop_on_nan", "train.exit_zero_on_signal",
        "train.device", "train.tf32", "train.compile", "train.peak_flops", "data.cache_dir", "data.num_proc",
        *[f"logger.{k}" for k in ("name", "project", "mode", "group", "tags", "run_name")],
        *[f"distributed.{k}" for k in ("name", "backend", "ep_size", "fsdp", "mixed_precision",
                                       "reshard_after_forward", "timeout_s", "ep_grad_bucket_mb")],
        "train.activation_checkpointing", "data.shard_tokens",
        *[f"train.profile.{k}" for k in ("enabled", "wait", "warmup", "active", "repeat", "top_ops", "memory")]])
    saved = load_config({"model": {"vocab_size": 384}})
    free = load_config({"model": {"vocab_size": 384}, "logger": {"name": "none"}, "train": {"log_interval": 3},
                        "distributed": {"timeout_s": 5}})
    assert config_changes(saved, free) == []
    changed = load_config({"model": {"vocab_size": 384}, "data": {"val_fraction": 0.1}, "router": {"top_k": 1},
                           "optim": {"lr": 1e-3, "beta2": 0.99}, "distributed": {"global_balance": False}})
    assert [c.field for c in config_changes(saved, changed)] == [
        "data.val_fraction", "distributed.global_balance", "model.router.top_k", "optim.beta2", "optim.lr"]
    # A whole section may be allowed; the command line's `router.*` names work as well.
    ok = load_config({"model": {"vocab_size": 384}, "router": {"top_k": 1}, "optim": {"lr": 1e-3, "beta2": 0.99},
                      "train": {"resume_allow": ["optim", "router.top_k"]}})
    assert [str(c.field) for c in check_resume_config(saved, ok, 10, "ckpt")] == ["model.router.top_k", "optim.beta2",
                                                                                "optim.lr"]


def test_train_dtype_is_compared_as_the_run_resolves_it():
    """Runs saved before `auto` became the default hold `fp32`; on a CPU that is what `auto` runs
    in, so they resume. A real change (fp32 -> bf16) is still refused, named as resolved."""
    cpu = {"model": {"vocab_size": 384}, "train": {"device": "cpu"}}
    old = load_config({**cpu, "train": {"device": "cpu", "dtype": "fp32"}})
    assert config_changes(old, load_config({**cpu, "train": {"device": "cpu", "dtype": "auto"}})) == []
    bf16 = load_config({**cpu, "train": {"device": "cpu", "dtype": "bf16"}})
    assert [(c.field, c.old, c.new) for c in config_changes(old, bf16)] == [("train.dtype", "fp32", "bf16")]
    assert [(c.field, c.old, c.new) for c in config_changes(load_config(cpu), bf16)] == [("train.dtype", "fp32", "bf16")]
    # Each run resolved on its own device: a GPU run's `auto` (bf16 there) is not a CPU's fp32, so
    # "auto" -> "fp32" on cuda is a change, also where this machine cannot resolve cuda (the raw
    # value is compared then, never this machine's default device).
    gpu = {"model": {"vocab_size": 384}}
    was = load_config({**gpu, "train": {"device": "cuda", "dtype": "auto"}})
    now = load_config({**gpu, "train": {"device": "cuda", "dtype": "fp32"}})
    assert [c.field for c in config_changes(was, now)] == ["train.dtype"]


def inject_nan_at(monkeypatch, step: int) -> None:
    """The training forward of `step` (one micro-batch per step) returns a NaN loss."""
    forward, calls = Transformer.forward, [0]

    def nan_forward(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if self.training:
            calls[0] += 1
            if calls[0] == step:
                nan = float("nan")
                return dataclasses.replace(out, loss=out.loss * nan, lm_loss=out.lm_loss * nan)
        return out
    monkeypatch.setattr(Transformer, "forward", nan_forward)


def test_a_nonfinite_loss_stops_at_the_last_good_step_which_resumes_exactly(reference, tmp_path, monkeypatch):
    run = tmp_path / "run"
    with monkeypatch.context() as m:
        inject_nan_at(m, 7)
        s = train(composed_cfg(reference.cache), run)
    stop = s["stopped_nonfinite"]
    assert {k: stop[k] for k in ("step", "what", "value")} == {"step": 7, "what": "loss", "value": "nan"}
    assert stop["checkpoint"] == str(run / "checkpoints" / "step_0000006.pt") and s["step"] == 6
    assert latest_checkpoint(run).name == "step_0000006.pt"  # not a checkpoint interval: written for the stop
    assert [r["step"] for r in strict_records(run)] == [0, 2, 4, 6]
    train(composed_cfg(reference.cache, "train.resume=auto"), run)
    assert_same_records(read_metrics(reference.run), read_metrics(run))


def test_with_stop_on_nan_off_nonfinite_values_are_valid_json_and_warned(reference, tmp_path, monkeypatch, caplog):
    run = tmp_path / "run"
    inject_nan_at(monkeypatch, 1)
    caplog.set_level(logging.WARNING, logger="moe")
    s = train(composed_cfg(reference.cache, "train.stop_on_nan=false", "train.max_steps=2", "train.log_interval=1",
                           "train.eval_interval=2"), run)
    assert s["step"] == 2 and "stopped_nonfinite" not in s
    recs = strict_records(run)
    assert recs[1]["step"] == 1 and recs[1]["train/loss"] is None and recs[1]["nonfinite"]["train/loss"] == "nan"
    assert "step 1: train/loss is nan (written to metrics.jsonl as null" in caplog.text
    assert caplog.text.count("train/loss is nan") == 1 and recs[2]["nonfinite"]["train/loss"] == "nan"  # warned once
    summary = json.loads((run / "summary.json").read_text(), parse_constant=pytest.fail)
    assert summary["final_val_loss"] is None and summary["nonfinite"]["final_val_loss"] == "nan"


def test_a_checkpoint_without_training_state_cannot_be_resumed():
    imported = {"model": {}, "config": {}, "step": 0, "imported_from": "/hf/mixtral"}  # what `moe.hf import` writes
    with pytest.raises(CheckpointError, match=r"not a training checkpoint \(imported from /hf/mixtral\): it has no "
                                              r"data/rng/log_window/optimizer entries.*moe.load_model"):
        check_training_state(imported, "ckpt")
    dcp = {"dcp_path": "x", "step": 5, "data": {}, "rng": {}, "log_window": {}, "config": {}}  # sharded weights
    check_training_state(dcp, "ckpt")
    # a weights-only file of our own (no import origin): the message names no origin
    with pytest.raises(CheckpointError) as e:
        check_training_state({"model": {}, "config": {}, "step": 3, "rng": {}}, "ckpt")
    assert str(e.value) == ("ckpt is not a training checkpoint: it has no data/log_window/optimizer entries, so no run "
                            "can resume from it; load its weights with moe.load_model instead")


def test_rng_state_round_trips_every_generator_the_step_draws_from():
    """After set_rng_state(rng_state()), torch, Python and numpy draw what they drew after the
    save, through a torch.save / weights-only load (the checkpoint's path), including numpy's
    cached Gaussian (has_gauss)."""
    np.random.seed(3)
    np.random.standard_normal()  # leaves half a Box-Muller pair cached
    buf = io.BytesIO()
    torch.save(rng_state(), buf)
    draws = (torch.rand(3).tolist(), random.random(), np.random.standard_normal(), np.random.randint(1 << 30))
    buf.seek(0)
    set_rng_state(torch.load(buf, weights_only=True))
    assert (torch.rand(3).tolist(), random.random(), np.random.standard_normal(), np.random.randint(1 << 30)) == draws


def test_seed_everything_seeds_torch_python_and_numpy():
    def draws():
        return torch.rand(2).tolist(), random.random(), float(np.random.rand())

    seed_everything(11)
    first = draws()
    seed_everything(11)
    assert draws() == first
    seed_everything(12)
    assert all(a != b for a, b in zip(draws(), first))


def test_the_cuda_generators_are_saved_and_restored_where_cuda_is_available(monkeypatch):
    """The CUDA branch on a CPU machine, with stand-ins for torch.cuda: saved when CUDA is available,
    restored only when the checkpoint has it and CUDA is available (a CPU checkpoint resumed on a
    GPU leaves the CUDA generators alone)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: ["cuda-state-0"])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", calls.append)
    state = rng_state()
    assert state["cuda"] == ["cuda-state-0"]
    set_rng_state(state)
    assert calls == [["cuda-state-0"]]
    del state["cuda"]
    set_rng_state(state)
    assert calls == [["cuda-state-0"]]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "cuda" not in rng_state()
    set_rng_state({**state, "cuda": ["cuda-state-1"]})  # a GPU checkpoint resumed on a CPU
    assert calls == [["cuda-state-0"]]
