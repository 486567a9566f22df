"""The resume checks of moe/train/resume.py called directly (docs/results/mutation/rerun2/README.md).

Within a training run `resolved_settings` describes both the checkpoint's run and the resumed one,
so a change to it changes both sides alike and no resume test notices; these tests pin its values,
the `Change` rows `resolved_changes` builds, `_shape_advice`'s wording and the branches of
`check_resume_config` that only an old checkpoint (no resolved record) or a shape-only refusal
reach. No GPU is needed: `torch.device("cuda")` is only a name here, and the dtypes are explicit
(`auto` would resolve differently on a GPU machine).
"""

from __future__ import annotations

import pytest
import torch

from moe.config import load_config
from moe.errors import CheckpointError, ConfigError
from moe.train.resume import (Change, _shape_advice, check_resume_config, check_resumed_vocab, resolved_changes,
                               resolved_settings)

CPU = torch.device("cpu")
CUDA = torch.device("cuda")  # a device name only: nothing is allocated on it
ADVICE = ("the parameters' shapes: a resume loads the checkpoint's tensors as they are, so train.resume_allow cannot "
          "admit it; to start a new run from this checkpoint's weights in another shape, use "
          "train.init_from=<checkpoint> (fine-tuning) instead of train.resume")


def _cfg(**train):
    return load_config({"model": {"vocab_size": 384}, "train": train})


def test_resolved_settings_are_the_dtype_tf32_and_device_a_run_uses():
    assert resolved_settings(_cfg(dtype="bf16", tf32=True), CPU) == {
        "train.dtype": "bf16", "train.tf32": "n/a", "distributed.mixed_precision": "n/a",
        "device": "cpu"}  # TF32 acts only on CUDA
    assert resolved_settings(_cfg(dtype="fp32", tf32=False), CPU) == {
        "train.dtype": "fp32", "train.tf32": "n/a", "distributed.mixed_precision": "n/a",
        "device": "cpu"}
    assert resolved_settings(_cfg(dtype="fp32", tf32=True), CUDA) == {
        "train.dtype": "fp32", "train.tf32": "on", "distributed.mixed_precision": "n/a",
        "device": "cuda"}
    assert resolved_settings(_cfg(dtype="bf16", tf32=False), CUDA) == {
        "train.dtype": "bf16", "train.tf32": "off", "distributed.mixed_precision": "n/a",
        "device": "cuda"}


def test_resolved_settings_name_train_dtype_in_their_error():
    cfg = _cfg()
    cfg.train.dtype = "fp8x"  # past the schema's check, as a program may set it
    with pytest.raises(ConfigError, match=r"^train\.dtype='fp8x' is not one of "):
        resolved_settings(cfg, CPU)


def test_resolved_changes_are_the_differing_resolved_fields_with_this_runs_device():
    cpu = {"train.dtype": "fp32", "train.tf32": "n/a", "device": "cpu"}
    gpu = {"train.dtype": "bf16", "train.tf32": "on", "device": "cuda"}
    changes = resolved_changes(cpu, gpu)
    assert [tuple(c) for c in changes] == [("train.dtype", "fp32", "bf16", "cuda"), ("train.tf32", "n/a", "on", "cuda")]
    assert str(changes[0]) == "train.dtype: the checkpoint's run used 'fp32', this run resolves it to 'bf16' on cuda"
    assert resolved_changes(gpu, {**gpu, "train.tf32": "off"}) == [Change("train.tf32", "on", "off", "cuda")]
    # A record without the device names none.
    no_device = {"train.dtype": "bf16", "train.tf32": "n/a"}
    assert [tuple(c) for c in resolved_changes(cpu, no_device)] == [("train.dtype", "fp32", "bf16", "this device")]
    # Nothing to compare: an older checkpoint with no record, or a field it did not record; equal values.
    assert resolved_changes(None, gpu) == [] and resolved_changes({}, gpu) == []
    assert resolved_changes({"train.tf32": "n/a"}, gpu) == [Change("train.tf32", "n/a", "on", "cuda")]
    assert resolved_changes(cpu, dict(cpu)) == []


def test_shape_advice_wording_for_one_and_for_several_fields():
    assert _shape_advice(["model.n_experts"]) == "model.n_experts changes " + ADVICE
    assert _shape_advice(["model.d_model", "model.n_experts"]) == "model.d_model, model.n_experts change " + ADVICE


def test_a_checkpoint_without_a_resolved_record_compares_train_dtype_as_configured():
    """An older checkpoint has no `resolved` entry: this run's record alone must not hide a dtype change."""
    saved, cfg = _cfg(dtype="fp32"), _cfg(dtype="bf16")
    with pytest.raises(CheckpointError) as e:
        check_resume_config(saved, cfg, 4, "c.pt", saved_resolved=None, resolved=resolved_settings(cfg, CPU))
    assert str(e.value).splitlines()[1] == "  train.dtype: checkpoint has 'fp32', config has 'bf16'"


def test_both_records_given_the_resolved_values_are_compared():
    cfg = _cfg(dtype="auto")
    cpu = {"train.dtype": "fp32", "train.tf32": "n/a", "device": "cpu"}
    gpu = {"train.dtype": "bf16", "train.tf32": "on", "device": "cuda"}
    with pytest.raises(CheckpointError) as e:
        check_resume_config(cfg, cfg, 4, "c.pt", saved_resolved=cpu, resolved=gpu)
    assert str(e.value).splitlines()[1:] == [
        "  train.dtype: the checkpoint's run used 'fp32', this run resolves it to 'bf16' on cuda",
        "  train.tf32: the checkpoint's run used 'n/a', this run resolves it to 'on' on cuda",
        "set them back, or allow the change on purpose with train.resume_allow=[train.dtype,train.tf32]"]
    assert check_resume_config(cfg, cfg, 4, "c.pt", saved_resolved=cpu, resolved=dict(cpu)) == []


def _model(n_experts: int, lr: float = 3e-3, allow=(), n_layers: int = 2, vocab_size: int = 384):
    return load_config({"model": {"vocab_size": vocab_size, "n_experts": n_experts, "n_layers": n_layers},
                        "optim": {"lr": lr}, "train": {"resume_allow": list(allow)}})


def test_a_refused_shape_field_alone_is_told_to_be_set_back_and_given_init_from():
    with pytest.raises(CheckpointError) as e:
        check_resume_config(_model(4), _model(8), 4, "c.pt")
    assert str(e.value).splitlines()[1:] == ["  model.n_experts: checkpoint has 4, config has 8",
                                              "set them back", "model.n_experts changes " + ADVICE]


def test_a_refused_shape_field_beside_a_free_one_gets_its_own_advice():
    with pytest.raises(CheckpointError) as e:
        check_resume_config(_model(4), _model(8, lr=1e-3), 4, "c.pt")
    assert str(e.value).splitlines()[3:] == [
        "set them back, or allow the change on purpose with train.resume_allow=[optim.lr]",
        "model.n_experts changes " + ADVICE]
    # Allowing the free one leaves the shape field refused alone.
    with pytest.raises(CheckpointError) as e:
        check_resume_config(_model(4), _model(8, lr=1e-3, allow=["optim.lr"]), 4, "c.pt")
    assert str(e.value).splitlines()[1:] == ["  model.n_experts: checkpoint has 4, config has 8",
                                              "set them back", "model.n_experts changes " + ADVICE]


def test_allowing_shape_fields_is_refused_word_for_word():
    with pytest.raises(CheckpointError) as e:
        check_resume_config(_model(4), _model(8, allow=["model.n_experts"]), 4, "c.pt")
    assert str(e.value) == "checkpoint c.pt: train.resume_allow lists model.n_experts, but model.n_experts changes " + ADVICE
    with pytest.raises(CheckpointError) as e:
        check_resume_config(_model(4), _model(8, n_layers=3, allow=["model"]), 4, "c.pt")
    assert str(e.value) == ("checkpoint c.pt: train.resume_allow lists model.n_experts, model.n_layers, but "
                            "model.n_experts, model.n_layers change " + ADVICE)


def test_a_resumed_vocab_that_differs_is_refused_word_for_word():
    check_resumed_vocab(_model(4), _model(4), "c.pt")  # the same vocabulary: nothing to say
    with pytest.raises(CheckpointError) as e:
        check_resumed_vocab(_model(4), _model(4, vocab_size=448), "c.pt")
    assert str(e.value) == ("checkpoint c.pt: model.vocab_size is 384 there, 448 here (from this run's tokenizer); "
                            "model.vocab_size changes " + ADVICE)
