"""End-to-end training: loss goes down, files are written, resume is exact, bad
checkpoints are clear errors."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe.checkpoint import CheckpointError, latest_checkpoint, list_checkpoints, load_model
from moe.config import load_config
from moe.train import train
from tests.conftest import REPO, SHARED_DATA

CORPUS = SHARED_DATA / "corpus" / "tinyshakespeare.txt"


def tiny_cfg(tmp_path, **over):
    raw = {
        "model": dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=32, max_seq_len=64),
        "router": dict(top_k=2, jitter=0.01),  # jitter: the RNG state must survive a resume too
        "data": dict(name="text", path=str(CORPUS), vocab_size=320, max_chars=200_000,
                     cache_dir=str(tmp_path / "cache"), num_proc=1),
        "train": dict(batch_size=4, seq_len=32, max_steps=12, log_interval=2, eval_interval=4, eval_batches=2,
                      ckpt_interval=4, keep_last=5),
        "optim": dict(lr=3e-3, warmup_steps=2),
        "logger": dict(name="none"),
    }
    for section, values in over.items():
        raw.setdefault(section, {}).update(values)
    return load_config(raw)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_tiny_run_lowers_loss_and_writes_everything(tmp_path):
    cfg = tiny_cfg(tmp_path, logger=dict(name="wandb"), train=dict(max_steps=30, eval_interval=10, ckpt_interval=10))
    run = tmp_path / "run"
    summary = train(cfg, run)
    assert summary["final_val_loss"] < summary["initial_val_loss"] - 0.5
    recs = read_metrics(run)
    assert recs[0]["step"] == 0 and "val/loss" in recs[0]
    logged = [r for r in recs if "train/loss" in r]
    assert [r["step"] for r in logged] == list(range(2, 31, 2))
    for key in ["train/loss", "train/lr", "perf/tokens_per_s", "perf/mfu", "moe/token_entropy_norm",
                "moe/load_entropy_norm", "moe/load_imbalance", "moe/load_cv", "moe/load_max", "moe/load_min",
                "moe/dropped_frac", "moe/dead_experts", "moe/aux_loss", "moe/z_loss", "moe/layer1/load_imbalance"]:
        assert key in logged[-1], key
    assert 0 < logged[-1]["perf/mfu"] < 1.5
    assert [r["step"] for r in recs if "val/loss" in r] == [0, 10, 20, 30]
    assert [p.name for p in list_checkpoints(run)] == ["step_0000010.pt", "step_0000020.pt", "step_0000030.pt"]
    assert (run / "plots" / "load_heatmap.png").stat().st_size > 1000
    offline = list((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("*.wandb"))
    model, tok, loaded_cfg = load_model(run)
    x = torch.tensor([tok.encode("ROMEO:")])
    assert model(x).logits.shape == (1, x.shape[1], loaded_cfg.model.vocab_size)
    assert not model.training


def test_resume_gives_the_same_loss_curve(tmp_path):
    full = tmp_path / "full"
    train(tiny_cfg(tmp_path), full)
    part = tmp_path / "part"
    s = train(tiny_cfg(tmp_path, train=dict(stop_after=6)), part)
    assert s["stopped_early"] and latest_checkpoint(part).name == "step_0000006.pt"
    # Simulate a crash after logging step 8 but before its checkpoint: these lines must go.
    with open(part / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 8, "train/loss": 123.0}) + "\n")
    train(tiny_cfg(tmp_path, train=dict(resume="auto")), part)
    a, b = read_metrics(full), read_metrics(part)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for key in ra:
            if key.startswith(("train/", "val/", "moe/")):
                assert ra[key] == rb[key], (ra["step"], key, ra[key], rb[key])
    wa = load_model(full)[0].state_dict()
    wb = load_model(part)[0].state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_from_explicit_path_and_grad_accum_equivalence(tmp_path):
    # Router losses are per micro-batch (f_i * P_i is not linear in the batch) and jitter
    # noise is drawn per micro-batch, so they are off here: then accumulating two halves is
    # the same update as one full batch, up to fp32 rounding.
    plain = dict(aux_loss_coef=0.0, z_loss_coef=0.0, jitter=0.0)
    one = train(tiny_cfg(tmp_path, router=plain, train=dict(max_steps=4, ckpt_interval=2)), tmp_path / "a")
    two = train(tiny_cfg(tmp_path, router=plain, train=dict(max_steps=4, ckpt_interval=2, grad_accum=2)), tmp_path / "b")
    assert two["final_val_loss"] == pytest.approx(one["final_val_loss"], rel=1e-4)
    ckpt = tmp_path / "a" / "checkpoints" / "step_0000002.pt"
    s = train(tiny_cfg(tmp_path, router=plain, train=dict(max_steps=4, ckpt_interval=2, resume=str(ckpt))),
              tmp_path / "c")
    assert s["run_dir"] == str(tmp_path / "a") and s["final_val_loss"] == one["final_val_loss"]


def test_corrupt_and_incompatible_checkpoints_are_clear_errors(tmp_path):
    run = tmp_path / "run"
    train(tiny_cfg(tmp_path, train=dict(max_steps=2, ckpt_interval=2)), run)
    ckpt = latest_checkpoint(run)
    with pytest.raises(CheckpointError, match="model.n_experts: checkpoint has 4, config has 8"):
        train(tiny_cfg(tmp_path, model=dict(n_experts=8), train=dict(resume="auto", max_steps=4)), run)
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        train(tiny_cfg(tmp_path, train=dict(resume="auto", max_steps=4)), run)
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_model(ckpt)
    with pytest.raises(CheckpointError, match="does not exist"):
        train(tiny_cfg(tmp_path, train=dict(resume=str(tmp_path / "nope.pt"))), tmp_path / "other")
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        load_model(tmp_path)


@pytest.mark.slow
def test_train_py_cli_run_and_resume_auto(tmp_path):
    """The README commands: a short CLI run, then `train.resume=auto` continues it."""
    out = tmp_path / "outputs" / "runs"
    common = ["data=text", f"data.path={CORPUS}", "data.vocab_size=320", "data.max_chars=100000",
              f"data.cache_dir={tmp_path / 'cache'}", "model.d_model=32", "model.n_layers=1", "train.batch_size=4",
              "train.seq_len=32", "train.log_interval=2", "train.eval_interval=4", "train.eval_batches=1",
              "train.ckpt_interval=4", "train.max_steps=8", "logger=none"]
    p = subprocess.run([sys.executable, "train.py", *common, "train.stop_after=4", f"hydra.run.dir={out}/first"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    p = subprocess.run([sys.executable, "train.py", *common, "train.resume=auto", f"hydra.run.dir={out}/second"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "resumed from" in (out / "second" / "train.log").read_text()
    steps = [r["step"] for r in read_metrics(out / "first") if "train/loss" in r]
    assert steps == [2, 4, 6, 8]
    assert math.isfinite(json.loads((out / "first" / "summary.json").read_text())["final_val_loss"])


@pytest.mark.slow
def test_hydra_multirun_sweep(tmp_path):
    """`python train.py -m router.top_k=1,2 ...`: one run directory per job, each complete,
    and each W&B run in the sweep's group."""
    sweep = tmp_path / "sweep"
    p = subprocess.run([sys.executable, "train.py", "-m", "router.top_k=1,2", "data=text", f"data.path={CORPUS}",
                        "data.vocab_size=320", "data.max_chars=50000", f"data.cache_dir={tmp_path / 'cache'}",
                        "model.d_model=32", "model.n_layers=1", "train.batch_size=2", "train.seq_len=16",
                        "train.max_steps=2", "train.log_interval=1", "train.eval_interval=2", "train.eval_batches=1",
                        f"hydra.sweep.dir={sweep}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    for job, k in ((0, 1), (1, 2)):
        cfg = json.loads((sweep / str(job) / "config.json").read_text())
        assert cfg["router"]["top_k"] == k and cfg["logger"]["group"] == "sweep"
        assert f"router={cfg['router']['name']}" in cfg["logger"]["tags"]
        assert [r["step"] for r in read_metrics(sweep / str(job)) if "train/loss" in r] == [1, 2]


@pytest.mark.slow
def test_torch_compile_trains_like_eager(tmp_path):
    """`train.compile=true` runs (grouped_mm falls back to its matmul loop while tracing fp32)
    and gives the eager run's losses up to compiler rounding."""
    eager = train(tiny_cfg(tmp_path, train=dict(max_steps=3, log_interval=1, eval_interval=3)), tmp_path / "e")
    comp = train(tiny_cfg(tmp_path, train=dict(max_steps=3, log_interval=1, eval_interval=3, compile=True)),
                 tmp_path / "c")
    a = [r["train/loss"] for r in read_metrics(tmp_path / "e") if "train/loss" in r]
    b = [r["train/loss"] for r in read_metrics(tmp_path / "c") if "train/loss" in r]
    assert len(a) == len(b) == 3
    assert b == pytest.approx(a, rel=1e-4)
    assert comp["final_val_loss"] == pytest.approx(eager["final_val_loss"], rel=1e-4)
