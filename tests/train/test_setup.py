"""A run's start (moe/train/setup.py): refusals leave no directory, the resume check runs before
any data work and names every changed field, fields that change parameter shapes are never
allowed on a resume, and the device-dependent fields are compared as each run resolved them."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

import moe.train.setup
from moe import cli, perf
from moe.config import field_paths, load_config
from moe.errors import CheckpointError, ConfigError, UserError
from moe.loading import read_any_checkpoint
from moe.model import Transformer
from moe.train import train
from moe.train.resume import SHAPE_FIELDS, check_resume_config, resolved_changes, resolved_settings
from tests.conftest import REPO
from tests.train.runs import CORPUS, composed_cfg, read_metrics

CPU = {"train.dtype": "fp32", "train.tf32": "n/a", "distributed.mixed_precision": "n/a", "device": "cpu"}
GPU = {"train.dtype": "bf16", "train.tf32": "on", "distributed.mixed_precision": "n/a", "device": "cuda"}


@pytest.mark.parametrize("extra, error, names", [
    (["attention=flash"], UserError, "attention.name='flash' needs flash-attn"),  # a backend this machine lacks
    (["data.path=/nonexistent/corpus.txt"], ConfigError, "data.path='/nonexistent/corpus.txt' does not exist"),
    (["router.drop_experts=[0]"], ConfigError, "router.drop_experts=[0] is an inference-time"),  # refused in training
])
def test_a_refused_run_leaves_no_directory(tmp_path, extra, error, names):
    run = tmp_path / "run"
    with pytest.raises(error) as refused:
        train(composed_cfg(tmp_path / "cache", *extra), run)
    line = cli.one_line(refused.value)  # what train.py prints after `error: `
    assert line.startswith(names), f"the refusal does not name the value: {line}"
    assert not run.exists()


# A refusal in train() (the backend, the data path) reaches train.py's handler the same way: the
# backend case runs through the command; the data-path case is the in-process test above.
@pytest.mark.parametrize("extra", [["attention=flash"], ["train.grad_accum=3"]])
def test_train_py_refused_at_start_leaves_no_directory_not_even_hydra_s(tmp_path, extra):
    run = tmp_path / "runs" / "one"
    p = subprocess.run([sys.executable, "train.py", "logger=none", f"data.cache_dir={tmp_path / 'cache'}", *extra,
                        f"hydra.run.dir={run}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1, p.stderr[-2000:]
    assert not run.exists()


def test_a_refused_branch_removes_the_history_it_copied(reference, tmp_path):
    """A resume of an older checkpoint branches into a new directory (its metrics start with the
    parent's); refused by the resume check, that directory goes again."""
    old = reference.run / "checkpoints" / "step_0000004.pt"
    branch = tmp_path / "branch"
    with pytest.raises(CheckpointError):
        train(composed_cfg(reference.cache, f"train.resume={old}", "optim.lr=1e-3"), branch)
    assert not branch.exists()


def test_the_resume_check_runs_before_any_data_work_and_names_the_data_fields(reference, tmp_path, monkeypatch):
    """Resuming with other data overrides: the error lists data.path and data.max_chars by name
    (not "the data changed"), before the other corpus is tokenised."""
    run = tmp_path / "run"
    train(composed_cfg(reference.cache, "train.stop_after=2"), run)

    def no_data_work(*a, **k):
        raise AssertionError("data prepared before the resume check")
    monkeypatch.setattr(moe.train.setup, "prepare_data", no_data_work)
    with pytest.raises(CheckpointError) as e:
        train(composed_cfg(reference.cache, "train.resume=auto", f"data.path={tmp_path / 'other.txt'}",
                           "data.max_chars=1000"), run)
    msg = str(e.value)
    assert "  data.max_chars: checkpoint has 200000, config has 1000" in msg
    assert f"  data.path: checkpoint has '{CORPUS}', config has '{tmp_path / 'other.txt'}'" in msg
    assert "the data changed" not in msg
    assert [r["step"] for r in read_metrics(run)] == [0, 2]  # the run is untouched


def test_shape_fields_are_never_allowed_and_name_init_from(tmp_path):
    saved = composed_cfg(tmp_path)
    saved.model.vocab_size = 320
    changed = composed_cfg(tmp_path, "model.n_experts=8", "optim.lr=1e-3")
    changed.model.vocab_size = 320
    with pytest.raises(CheckpointError) as e:
        check_resume_config(saved, changed, 4, "c.pt")
    lines = str(e.value).splitlines()
    assert lines[1:3] == ["  model.n_experts: checkpoint has 4, config has 8",
                          "  optim.lr: checkpoint has 0.003, config has 0.001"]
    # The suggestion offers only what a resume can do; the shape field gets train.init_from.
    assert lines[3] == "set them back, or allow the change on purpose with train.resume_allow=[optim.lr]"
    assert lines[4].startswith("model.n_experts changes the parameters' shapes") and "train.init_from" in lines[4]
    # Following the old advice (allowing it) is refused too, with the same way out, not a load_state_dict traceback.
    changed.train.resume_allow = ["model.n_experts", "optim.lr"]
    with pytest.raises(CheckpointError, match="train.resume_allow lists model.n_experts, but .*train.init_from"):
        check_resume_config(saved, changed, 4, "c.pt")
    changed.train.resume_allow = ["model", "optim.lr"]  # a whole section admits no shape either
    with pytest.raises(CheckpointError, match="train.init_from"):
        check_resume_config(saved, changed, 4, "c.pt")


# A changed value for every model field (the variant sections aside); the base has a shared
# expert and a dense layer so that the fields sizing them matter.
BASE = {"vocab_size": 384, "d_model": 32, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2, "n_experts": 4,
        "expert_hidden": 32, "n_shared_experts": 1, "n_dense_layers": 1, "max_seq_len": 64}
CHANGED = {"vocab_size": 448, "d_model": 64, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4, "head_dim": 16,
           "qkv_bias": True, "attn_out_bias": True, "qk_norm": "head", "clip_qkv": 8.0, "max_seq_len": 128,
           "rope_theta": 5e5, "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "norm_eps": 1e-6,
           "tie_embeddings": True, "n_experts": 8, "expert_hidden": 64, "n_shared_experts": 2,
           "shared_expert_hidden": 48, "shared_expert_gate": True, "n_dense_layers": 2, "dense_layers": [2],
           "dense_hidden": 48, "init_std": 0.01, "layer_types": ["full", "full", "full"], "sliding_window": 8,
           "attention_sinks": True, "expert_activation": "clamped_swiglu", "swiglu_alpha": 1.5, "swiglu_limit": 5.0,
           "expert_bias": True, "router_bias": True, "mtp_depth": 1, "routed_scaling_factor": 2.5}
# MLA's fields only exist together: each is changed from an MLA base (and attention_kind from BASE to it).
MLA = {"attention_kind": "mla", "n_kv_heads": 4, "q_lora_rank": None, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
       "qk_rope_head_dim": 4, "v_head_dim": 8, "rope_interleave": False}
MLA_CHANGED = {"q_lora_rank": 12, "kv_lora_rank": 24, "qk_nope_head_dim": 12, "qk_rope_head_dim": 8, "v_head_dim": 12,
               "rope_interleave": True}


def _shapes(model_over: dict) -> dict:
    with torch.device("meta"):
        model = Transformer(load_config({"model": {**BASE, **model_over}, "train": {"seq_len": 32}}).model)
    # named_parameters lists a tied weight once: tying the embeddings removes a parameter
    return {k: tuple(v.shape) for k, v in model.named_parameters()}


def test_shape_fields_are_exactly_the_model_fields_that_change_the_parameters():
    fields = sorted({f.split(".")[1] for f in field_paths() if f.startswith("model.")
                     and f.split(".")[1] not in ("router", "attention", "experts")})
    assert sorted([*CHANGED, "attention_kind", *MLA_CHANGED]) == fields  # a new model field needs a row here
    base, mla = _shapes({}), _shapes(MLA)
    changing = {f"model.{k}" for k, v in CHANGED.items() if _shapes({k: v}) != base}
    changing |= {f"model.{k}" for k, v in MLA_CHANGED.items() if _shapes({**MLA, k: v}) != mla}
    if mla != base:
        changing.add("model.attention_kind")
    assert changing == set(SHAPE_FIELDS)


def test_resolved_settings_follow_the_device(monkeypatch):
    """Stand-ins for a CUDA device with bf16 (no GPU needed): `auto` is bf16 and TF32 acts there."""
    monkeypatch.setattr(perf, "auto_dtype", lambda device: torch.bfloat16 if device.type == "cuda" else torch.float32)
    cfg = load_config({"model": {"vocab_size": 384}})
    assert resolved_settings(cfg, torch.device("cpu")) == CPU
    assert resolved_settings(cfg, torch.device("cuda")) == GPU
    cfg.train.tf32, cfg.train.dtype = False, "fp32"
    assert resolved_settings(cfg, torch.device("cuda")) == {**GPU, "train.dtype": "fp32", "train.tf32": "off"}


def test_fsdps_parameter_dtype_is_compared_as_resolved_where_both_runs_use_fsdp(monkeypatch):
    """`distributed.mixed_precision=auto` is bf16 only under FSDP on CUDA with bf16: compared as resolved between
    two FSDP runs; a layout without FSDP ("n/a") on either side is a layout change, which a resume may make."""
    monkeypatch.setattr(perf, "auto_dtype", lambda device: torch.bfloat16 if device.type == "cuda" else torch.float32)
    cfg = load_config({"model": {"vocab_size": 384}, "distributed": {"name": "fsdp"}})
    cpu, gpu = resolved_settings(cfg, torch.device("cpu")), resolved_settings(cfg, torch.device("cuda"))
    assert (cpu["distributed.mixed_precision"], gpu["distributed.mixed_precision"]) == ("fp32", "bf16")
    cfg.distributed.mixed_precision = "bf16"
    assert resolved_settings(cfg, torch.device("cpu"))["distributed.mixed_precision"] == "bf16"
    ep = load_config({"model": {"vocab_size": 384}, "distributed": {"name": "ep", "fsdp": True}})
    assert resolved_settings(ep, torch.device("cuda"))["distributed.mixed_precision"] == "bf16"
    ep.distributed.fsdp = False
    assert resolved_settings(ep, torch.device("cuda"))["distributed.mixed_precision"] == "n/a"
    assert [c.field for c in resolved_changes(cpu, gpu)] == ["train.dtype", "train.tf32", "distributed.mixed_precision"]
    assert [c.field for c in resolved_changes(GPU, gpu)] == []  # no FSDP before: a layout change
    assert [c.field for c in resolved_changes(gpu, GPU)] == []  # no FSDP now
    explicit = {**cpu, "distributed.mixed_precision": "bf16"}  # mixed_precision=bf16 set by hand this time
    (change,) = resolved_changes(cpu, explicit)
    assert (change.field, change.old, change.new) == ("distributed.mixed_precision", "fp32", "bf16")


def test_a_resume_on_another_device_is_a_change_of_the_resolved_values(reference, tmp_path, monkeypatch, caplog):
    """The reference ran on this CPU (`auto` -> fp32, no TF32) and its checkpoint says so; resumed
    where `auto` resolves to bf16 with TF32 (a stand-in resolver), the same raw config is a change:
    refused unless allowed, and logged when allowed."""
    state = read_any_checkpoint(reference.run / "checkpoints" / "step_0000004.pt")
    assert state["resolved"] == CPU
    run = tmp_path / "run"
    train(composed_cfg(reference.cache, "train.stop_after=2"), run)
    monkeypatch.setattr(moe.train.setup, "resolved_settings", lambda cfg, device: GPU)
    with pytest.raises(CheckpointError) as e:
        train(composed_cfg(reference.cache, "train.resume=auto"), run)
    assert str(e.value).splitlines()[1:3] == [
        "  train.dtype: the checkpoint's run used 'fp32', this run resolves it to 'bf16' on cuda",
        "  train.tf32: the checkpoint's run used 'n/a', this run resolves it to 'on' on cuda"]
    assert "train.resume_allow=[train.dtype,train.tf32]" in str(e.value)
    caplog.set_level(logging.INFO, logger="moe")
    s = train(composed_cfg(reference.cache, "train.resume=auto", "train.resume_allow=[train.dtype,train.tf32]",
                           "train.stop_after=3"), run)
    assert s["step"] == 3
    assert "resume: train.dtype changes from 'fp32' to 'bf16' (train.resume_allow)" in caplog.text
    assert "resume: train.tf32 changes from 'n/a' to 'on' (train.resume_allow)" in caplog.text
