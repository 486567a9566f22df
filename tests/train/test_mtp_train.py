"""Training with multi-token prediction (model.mtp_depth, train.mtp_loss_coef): the schedule and
the per-depth records, exact resume, activation checkpointing, checkpoints that `load_model`
serves with their MTP weights, and HF export's refusal."""

from __future__ import annotations

import shutil

import pytest
import torch

from moe.errors import ConfigError
from moe.hf.commands import export_hf
from moe.loading import load_model
from moe.train import train
from tests.train.runs import MAX_STEPS, assert_same_records, composed_cfg, read_metrics

MTP = ("model.mtp_depth=2", "train.mtp_loss_coef=0.3", "train.mtp_loss_coef_after=0.1",
       "train.mtp_loss_switch_step=4")


@pytest.fixture(scope="module")
def mtp_reference(reference, tmp_path_factory):
    run = tmp_path_factory.mktemp("mtp") / "run"
    train(composed_cfg(reference.cache, *MTP), run)
    return run


def test_each_depth_logs_its_loss_and_accuracy_and_the_coefficient_follows_its_schedule(mtp_reference, reference):
    records = [r for r in read_metrics(mtp_reference) if "train/loss" in r]
    assert [r["step"] for r in records] == list(range(2, MAX_STEPS + 1, 2))
    assert [r["train/mtp_coef"] for r in records] == [0.3, 0.3, 0.1, 0.1, 0.1]  # steps 1-4, then 5-10
    for r in records:
        for k in (1, 2):
            assert 0 < r[f"train/mtp{k}_loss"] < 10 and 0 <= r[f"train/mtp{k}_acc"] <= 1
    first, last = records[0], records[-1]
    assert last["train/mtp1_loss"] < first["train/mtp1_loss"]  # the modules learn
    plain = [r for r in read_metrics(reference.run) if "train/loss" in r]
    assert not any("mtp" in k for r in plain for k in r)  # and a run without them logs nothing of them


def test_a_resumed_mtp_run_logs_what_the_uninterrupted_one_does(mtp_reference, reference, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(reference.cache, cache)
    run = tmp_path / "run"
    train(composed_cfg(cache, *MTP, "train.stop_after=3"), run)  # inside a logging window, before the switch
    train(composed_cfg(cache, *MTP, "train.resume=auto", "train.stop_after=5"), run)  # after the switch
    train(composed_cfg(cache, *MTP, "train.resume=auto"), run)
    assert_same_records(read_metrics(mtp_reference), read_metrics(run))


def test_activation_checkpointing_recomputes_the_mtp_blocks_and_logs_the_same_numbers(mtp_reference, reference,
                                                                                      tmp_path):
    run = tmp_path / "run"
    train(composed_cfg(reference.cache, *MTP, "train.activation_checkpointing=full"), run)
    a, b = read_metrics(mtp_reference), read_metrics(run)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for key in (k for k in ra if k.startswith(("train/mtp", "train/loss", "val/loss"))):
            assert rb[key] == pytest.approx(ra[key], rel=1e-4, abs=1e-6), (ra["step"], key)


def test_load_model_serves_the_mtp_weights_and_hf_export_refuses_them(mtp_reference, tmp_path):
    model, _tok, cfg = load_model(mtp_reference)
    assert cfg.model.mtp_depth == 2 and model.mtp is not None and model.mtp.depth == 2
    saved = torch.load(sorted((mtp_reference / "checkpoints").glob("*.pt"))[-1], map_location="cpu",
                       weights_only=False)["model"]
    for name, tensor in model.state_dict().items():
        if name.startswith("mtp."):
            torch.testing.assert_close(tensor, saved[name])
    with pytest.raises(ConfigError, match=r"model.mtp_depth=2 cannot be expressed as a .* no multi-token-prediction"):
        export_hf(mtp_reference, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
