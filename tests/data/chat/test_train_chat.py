"""`python train.py data=chat` end to end on the repository's chat set: a few steps, packed and padded."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

ARGS = ["data=chat", f"data.path={REPO / 'tests/fixtures/chat/messages.jsonl'}", "data.val_fraction=0.2",
        "data.vocab_size=400", "model.d_model=32", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
        "model.n_experts=4", "model.expert_hidden=32", "model.max_seq_len=128", "train.batch_size=2",
        "train.seq_len=96", "train.max_steps=3", "train.log_interval=1", "train.eval_interval=3",
        "train.eval_batches=1", "train.peak_flops=1e9", "optim.warmup_steps=1", "logger=none"]


@pytest.mark.parametrize("packing", ["true", "false"])
def test_train_py_runs_on_chat_data(tmp_path, packing):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "train.py", *ARGS, f"data.packing={packing}", f"hydra.run.dir={run}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_val_loss"] > 0 and (run / "tokenizer" / "tokenizer.json").is_file()


def test_chat_data_without_a_source_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "train.py", "data=chat", "logger=none", f"hydra.run.dir={tmp_path / 'r'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "data=chat needs data.path" in proc.stderr
    assert not (tmp_path / "r").exists()
