"""train.init_from (moe/train/init_from.py) and train.trainable (moe/train/trainable.py): a run
starts from the weights, model config and tokenizer of an HF directory or a run of ours; model
overrides are checked; routers can be swapped and trained alone; bad input is one line, exit 2,
nothing written; a resumed fine-tune continues from its own checkpoints."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys

import pytest
import torch

from moe import cli
from moe.errors import CheckpointError, ConfigError, UserError
from moe.loading import load_model, read_any_checkpoint
from moe.train import JobInfo
from moe.train.setup import setup_run
from moe.logging import NullLogger
from tests.conftest import REPO
from tests.hf_fixtures import random_hf_model, save_word_tokenizer
from tests.train.finetune_helpers import composed, finetune_args, run, word_corpus

OLMOE = "olmoe-gqa1-bias-clip"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return word_corpus(tmp_path_factory.mktemp("corpus"))


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models (tests/conftest.py)


def start(args, run_dir):
    """setup_run only: the model as the first step would see it."""
    return setup_run(composed(args), run_dir, JobInfo(overrides=list(args)), lambda *a, **k: NullLogger())


def test_hf_source_gives_weights_config_and_tokenizer(hf_dirs, corpus, tmp_path):
    src, _ = hf_dirs(OLMOE)
    parts = start(finetune_args(src, corpus, tmp_path / "cache", "router.aux_loss_coef=0"), tmp_path / "run")
    ref, tok, _ = load_model(src, dtype="fp32")
    assert parts.model.cfg.n_experts == ref.cfg.n_experts and parts.model.cfg.clip_qkv == ref.cfg.clip_qkv
    assert parts.model.cfg.router.aux_loss_coef == 0.0 and parts.step == 0 and not parts.resumed
    ours = parts.model.state_dict()
    for name, t in ref.state_dict().items():
        assert torch.equal(ours[name], t), name
    assert parts.data.tokenizer.vocab_size == tok.vocab_size  # the source's tokenizer tokenised the data
    record = json.loads((tmp_path / "run" / "config.json").read_text())
    assert record["train"]["init_from"] == str(src)
    assert record["run"]["init_from"]["family"] == "olmoe" and record["run"]["init_from"]["kind"] == "hf"
    assert parts.optimizer.state == {}  # a fresh optimizer


def test_bf16_source_trains_with_fp32_master_weights(tmp_path, corpus):
    src = tmp_path / "bf16"
    random_hf_model(OLMOE, seed=3).to(torch.bfloat16).save_pretrained(str(src))
    save_word_tokenizer(src)
    parts = start(finetune_args(src, corpus, tmp_path / "cache", "train.dtype=fp32"), tmp_path / "run")
    ref, _, _ = load_model(src)  # as stored: bf16
    assert next(ref.parameters()).dtype == torch.bfloat16
    for name, p in parts.model.named_parameters():
        assert p.dtype == torch.float32, name
        assert torch.equal(p, ref.get_parameter(name).float()), name


def test_model_conflict_is_one_error_naming_the_field(hf_dirs, corpus, tmp_path):
    src, _ = hf_dirs(OLMOE)
    with pytest.raises(ConfigError, match=r"model.d_model=64 conflicts with train.init_from=.*model.d_model=32"):
        start(finetune_args(src, corpus, tmp_path / "cache", "model.d_model=64"), tmp_path / "run")
    with pytest.raises(ConfigError, match=r"model=<preset>"):
        start(finetune_args(src, corpus, tmp_path / "cache", "model=small"), tmp_path / "run")
    assert not (tmp_path / "run").exists()
    # the same value as the source is no conflict; max_seq_len with rope scaling is a fine-tune change
    parts = start(finetune_args(src, corpus, tmp_path / "cache", "model.d_model=32", "model.max_seq_len=256",
                                "+model.rope_scaling={rope_type: linear, factor: 2.0}"), tmp_path / "ok")
    assert parts.model.cfg.max_seq_len == 256 and parts.model.cfg.max_context == 512


def test_router_retraining_keeps_the_gate_and_trains_only_routers(hf_dirs, corpus, tmp_path, caplog):
    src, _ = hf_dirs(OLMOE)
    args = finetune_args(src, corpus, tmp_path / "cache", "router=aux_free", "router.score_func=softmax",
                         "train.trainable=[*router*]")
    ref, _, _ = load_model(src, dtype="fp32")
    with caplog.at_level(logging.INFO, logger="moe"):
        summary = run(args, tmp_path / "run")
    assert "parameters trainable" in caplog.text and "router=aux_free" in caplog.text
    n_router = sum(p.numel() for n, p in ref.named_parameters() if "router" in n)
    assert summary["trainable_params"] == n_router
    state = read_any_checkpoint(tmp_path / "run" / "checkpoints" / "step_0000003.pt")
    model = state["model"]
    assert state["config"]["model"]["router"]["name"] == "aux_free"
    assert state["config"]["model"]["router"]["top_k"] == ref.cfg.router.top_k  # carried over
    for name, t in ref.state_dict().items():
        if "router" in name:
            assert not torch.equal(model[name], t), f"{name} was not trained"
        else:
            assert torch.equal(model[name], t), f"{name} changed though frozen"
    biases = [t for n, t in model.items() if n.endswith("e_score_correction_bias")]
    assert biases and all(b.abs().sum() > 0 for b in biases)  # started at 0, moved by the balancing
    # the optimizer holds state for the router gates only
    n_state = sum(v["exp_avg"].numel() for v in state["optimizer"]["state"].values())
    assert n_state == n_router


def test_gate_is_kept_and_bias_starts_at_zero(hf_dirs, corpus, tmp_path):
    src, _ = hf_dirs(OLMOE)
    parts = start(finetune_args(src, corpus, tmp_path / "cache", "router=aux_free"), tmp_path / "run")
    ref, _, _ = load_model(src, dtype="fp32")
    routers = [b.ffn.router for b in parts.model.layers if b.is_moe]
    assert routers and all(type(r).__name__ == "AuxFreeRouter" for r in routers)
    for i, r in enumerate(routers):
        assert torch.equal(r.weight, ref.layers[i].ffn.router.weight)
        assert torch.equal(r.e_score_correction_bias, torch.zeros_like(r.e_score_correction_bias))


def test_run_dir_source_and_its_resume(hf_dirs, corpus, tmp_path):
    """A run of ours as the source; the fine-tune stops at step 2 and resumes from its own
    checkpoint (not the source) to the same numbers as an uninterrupted one."""
    src, _ = hf_dirs(OLMOE)
    run(finetune_args(src, corpus, tmp_path / "cache", steps=2), tmp_path / "base")
    args = finetune_args(tmp_path / "base", corpus, tmp_path / "cache", "train.ckpt_interval=2", steps=4)
    full = run(args, tmp_path / "full")
    run([*args, "train.stop_after=2"], tmp_path / "part")
    resumed = run([*args, "train.resume=auto"], tmp_path / "part")
    assert resumed["final_val_loss"] == full["final_val_loss"]
    record = json.loads((tmp_path / "part" / "config.json").read_text())["run"]
    assert record["init_from"]["kind"] == "checkpoint" and record["resumes"][0]["step"] == 2


BAD_INPUT = [
    (["train.init_from={tmp}/nothing"], "train.init_from=.*does not exist"),
    (["train.init_from={tmp}"], "train.init_from=.*no checkpoint found"),
    (["train.init_from={llama}"], "holds a 'llama' model; moe-lab converts the families"),
    (["model.n_layers=5"], "model.n_layers=5 conflicts with train.init_from"),
    (["train.trainable=[*no_such*]"], r"train.trainable: \['\*no_such\*'\] match no parameter"),
]


def bad_input_args(hf_dirs, corpus, tmp_path, extra) -> list[str]:
    src, _ = hf_dirs(OLMOE)
    llama = tmp_path / "llama"
    llama.mkdir(exist_ok=True)
    (llama / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return finetune_args(src, corpus, tmp_path / "cache", *[e.format(tmp=tmp_path, llama=llama) for e in extra])


@pytest.mark.parametrize("extra, message", BAD_INPUT)
def test_bad_input_is_one_user_error_line_nothing_written(hf_dirs, corpus, tmp_path, extra, message):
    """Each refusal as train.py meets it (the composed config, then train()), in-process: a UserError
    whose one-line form (what train.py prints after `error: `) names the problem, and no run directory.
    The command line around it (exit 2, one line on stderr, Hydra's directory removed) is the same
    code for every UserError: the test below runs it once through `python train.py`."""
    run_dir = tmp_path / "run"
    with pytest.raises(UserError) as refused:
        run(bad_input_args(hf_dirs, corpus, tmp_path, extra), run_dir)
    line = cli.one_line(refused.value)
    assert re.search(message, line), line
    assert not run_dir.exists(), "a refused run left its directory"


@pytest.mark.slow  # one train.py process (~10 s); every refusal of BAD_INPUT runs in-process above
def test_bad_input_through_train_py_is_one_line_exit_2_nothing_written(hf_dirs, corpus, tmp_path):
    extra, message = BAD_INPUT[-1]  # the refusal met last, once the model is built
    run_dir = tmp_path / "run"
    p = subprocess.run([sys.executable, "train.py", *bad_input_args(hf_dirs, corpus, tmp_path, extra),
                        f"hydra.run.dir={run_dir}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr[-2000:]
    assert re.search(message, lines[0]), lines[0]
    assert not run_dir.exists(), "train.py left Hydra's run directory behind"


def test_trainable_set_refusals(hf_dirs, corpus, tmp_path):
    src, _ = hf_dirs(OLMOE)
    with pytest.raises(ConfigError, match="leaves nothing to train"):  # hash routing's gate is not trainable
        start(finetune_args(src, corpus, tmp_path / "cache", "router=hash", "train.trainable=[*router*]"),
              tmp_path / "run")
    with pytest.raises(CheckpointError, match="train.init_from=.*no checkpoint found"):
        start(finetune_args(tmp_path, corpus, tmp_path / "cache"), tmp_path / "run")
    assert not (tmp_path / "run").exists()
