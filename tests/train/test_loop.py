"""End-to-end training: loss goes down, files are written, resume is exact, bad
checkpoints are clear errors."""

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe.checkpoint import latest_checkpoint, list_checkpoints
from moe.loading import load_model
from moe.errors import CheckpointError, ConfigError
from moe.config import load_config
from moe.routing.routers import router_config
from moe import perf
from moe.train import loop, train
from tests.conftest import REPO, SHARED_DATA, tiny_model_config
from tests.train.runs import assert_same_records, composed_cfg

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
    for key in ["train/loss", "train/lr", "perf/tokens_per_s", "perf/model_flops_per_s", "moe/token_entropy_norm",
                "moe/load_entropy_norm", "moe/load_imbalance", "moe/load_cv", "moe/load_max", "moe/load_min",
                "moe/dropped_frac", "moe/dead_experts", "moe/aux_loss", "moe/z_loss", "moe/layer1/load_imbalance"]:
        assert key in logged[-1], key
    # MFU only against a trustworthy peak (none is measured on a busy machine), and never above 1
    assert all(0 < r["perf/mfu"] <= 1 for r in logged if "perf/mfu" in r)
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
    # Step 5 is neither a log, a validation nor a checkpoint step: the stop adds no record and the
    # checkpoint carries the half-open logging window (steps 5-6 are logged together at 6).
    s = train(tiny_cfg(tmp_path, train=dict(stop_after=5)), part)
    assert s["stopped_early"] and latest_checkpoint(part).name == "step_0000005.pt"
    assert [r["step"] for r in read_metrics(part)] == [0, 2, 4]
    # Simulate a crash after logging step 6 but before its checkpoint: these lines must go, and
    # the torn last line of a write the crash cut short too.
    with open(part / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 6, "train/loss": 123.0}) + "\n" + '{"step": 8, "train/lo')
    train(tiny_cfg(tmp_path, train=dict(resume="auto")), part)
    assert_same_records(read_metrics(full), read_metrics(part))
    wa = load_model(full)[0].state_dict()
    wb = load_model(part)[0].state_dict()
    assert sorted(wa) == sorted(wb) and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_from_explicit_path_and_grad_accum_equivalence(tmp_path):
    # Router losses are per micro-batch (f_i * P_i is not linear in the batch) and jitter
    # noise is drawn per micro-batch, so they are off here: then accumulating two halves is
    # the same update as one full batch, up to fp32 rounding.
    plain = dict(aux_loss_coef=0.0, z_loss_coef=0.0, jitter=0.0)
    one = train(tiny_cfg(tmp_path, router=plain, train=dict(max_steps=4, ckpt_interval=2)), tmp_path / "a")
    two = train(tiny_cfg(tmp_path, router=plain, train=dict(max_steps=4, ckpt_interval=2, grad_accum=2)), tmp_path / "b")
    assert two["final_val_loss"] == pytest.approx(one["final_val_loss"], rel=1e-4)
    # An older checkpoint of a run branches into the new directory; the original stays as it was.
    a_files = {p: p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file()}
    ckpt = tmp_path / "a" / "checkpoints" / "step_0000002.pt"
    s = train(tiny_cfg(tmp_path, router=plain, train=dict(max_steps=4, ckpt_interval=2, resume=str(ckpt))),
              tmp_path / "c")
    assert s["run_dir"] == str(tmp_path / "c") and s["final_val_loss"] == one["final_val_loss"]
    assert {p: p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file()} == a_files
    assert_same_records(read_metrics(tmp_path / "a"), read_metrics(tmp_path / "c"))
    assert json.loads((tmp_path / "c" / "config.json").read_text())["run"]["parent_checkpoint"] == str(ckpt)


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
    """The commands of docs/guides/training.md: a short CLI run, then `train.resume=auto` continues it."""
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
    # The resumed part writes into the resumed run's directory, console log included, and leaves
    # no directory of its own.
    log = (out / "first" / "train.log").read_text()
    assert "resumed from" in log and log.index("step 4/8") < log.index("resumed from") < log.index("step 6/8")
    assert not (out / "second").exists()
    steps = [r["step"] for r in read_metrics(out / "first") if "train/loss" in r]
    assert steps == [2, 4, 6, 8]
    assert math.isfinite(json.loads((out / "first" / "summary.json").read_text())["final_val_loss"])


@pytest.mark.slow
def test_hydra_multirun_sweep(tmp_path):
    """`python train.py -m router.top_k=1,2 ...`: one run directory per job, each complete,
    and each W&B run in the sweep's group. Re-run in the other order with `train.resume=auto`,
    each job resumes the run of its own overrides (job 0 is now top_k=2: it resumes `1/`).
    `train.resume=auto` in the first sweep resumes nothing: a sibling job is not an earlier run."""
    sweep = tmp_path / "sweep"
    common = ["data=text", f"data.path={CORPUS}", "data.vocab_size=320", "data.max_chars=50000",
              f"data.cache_dir={tmp_path / 'cache'}", "model.d_model=32", "model.n_layers=1", "train.batch_size=2",
              "train.seq_len=16", "train.max_steps=2", "train.log_interval=1", "train.eval_interval=2",
              "train.eval_batches=1", f"hydra.sweep.dir={sweep}"]
    # `train.resume=auto` already in the first sweep: job 1 must not continue job 0's checkpoint
    # (its sibling, written just before), it starts fresh.
    p = subprocess.run([sys.executable, "train.py", "-m", "router.top_k=1,2", "train.resume=auto", *common],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    for job, k in ((0, 1), (1, 2)):
        cfg = json.loads((sweep / str(job) / "config.json").read_text())
        assert cfg["model"]["router"]["top_k"] == k and cfg["logger"]["group"] == "sweep"
        assert f"router={cfg['model']['router']['name']}" in cfg["logger"]["tags"]
        assert [r["step"] for r in read_metrics(sweep / str(job)) if "train/loss" in r] == [1, 2]
    logs = {job: (sweep / str(job) / "train.log").read_text() for job in (0, 1)}
    assert not any("resumed from" in log for log in logs.values())
    p = subprocess.run([sys.executable, "train.py", "-m", "router.top_k=2,1", "train.resume=auto", *common],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    for job, k in ((0, 1), (1, 2)):
        run = json.loads((sweep / str(job) / "config.json").read_text())["run"]
        assert f"router.top_k={k}" in run["overrides"] and len(run["resumes"]) == 1
        assert f"router.top_k={k}" in run["resumes"][0]["overrides"]
        log = (sweep / str(job) / "train.log").read_text()
        assert log.startswith(logs[job]) and log.count("resumed from") == 1  # its own log, continued
        assert [r["step"] for r in read_metrics(sweep / str(job)) if "train/loss" in r] == [1, 2]


@pytest.mark.slow
def test_torch_compile_trains_like_eager(tmp_path):
    """`train.compile=true` runs (grouped_mm falls back to its matmul loop while tracing fp32)
    and gives the eager run's losses up to compiler rounding."""
    # One layer: the compiler's time grows with the graph, and one block already has every op kind.
    one = dict(n_layers=1)
    eager = train(tiny_cfg(tmp_path, model=one, train=dict(max_steps=3, log_interval=1, eval_interval=3)), tmp_path / "e")
    comp = train(tiny_cfg(tmp_path, model=one, train=dict(max_steps=3, log_interval=1, eval_interval=3, compile=True)),
                 tmp_path / "c")
    a = [r["train/loss"] for r in read_metrics(tmp_path / "e") if "train/loss" in r]
    b = [r["train/loss"] for r in read_metrics(tmp_path / "c") if "train/loss" in r]
    assert len(a) == len(b) == 3
    assert b == pytest.approx(a, rel=1e-4)
    assert comp["final_val_loss"] == pytest.approx(eager["final_val_loss"], rel=1e-4)


def test_training_refuses_dropped_experts(tmp_path):
    from moe.config import Config

    cfg = Config(model=dataclasses.replace(tiny_model_config(), router=router_config(drop_experts=[0])))
    with pytest.raises(ConfigError, match=r"router.drop_experts=\[0\] is an inference-time ablation"):
        train(cfg, tmp_path)


def test_a_run_reports_honestly(tmp_path, monkeypatch, caplog):
    """A planted slow matmul peak (1 kFLOP/s, "measured" on a quiet machine): MFU is dropped with a
    warning instead of being logged in the thousands of percent; the run directory is printed at
    the start and a closing summary at the end, with logger=none; the short run warns and decays."""
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "moe-lab"))
    monkeypatch.setattr(perf, "busy_reason", lambda: None)
    monkeypatch.setattr(perf, "time_matmuls", lambda *a, **k: [1e3] * 9)
    import moe.train.loop
    monkeypatch.setattr(moe.train.loop, "measure_matmul_peak", lambda *a, **k: 1e3, raising=False)  # older loop
    caplog.set_level("INFO", logger="moe")
    run = tmp_path / "run"
    cfg = tiny_cfg(tmp_path, train=dict(max_steps=8, eval_interval=4, ckpt_interval=4), optim=dict(warmup_steps=20))
    summary = train(cfg, run)

    logged = [r for r in read_metrics(run) if "train/loss" in r]
    assert logged and all(r["perf/model_flops_per_s"] > 1e3 for r in logged)
    assert all(r.get("perf/mfu", 0.0) <= 1.0 for r in logged)
    assert "MFU is no longer reported" in caplog.text
    assert logged[-1]["train/lr"] < 0.2 * cfg.optim.lr  # decayed, not stuck at the peak
    assert "train.max_steps=8 is short for optim.warmup_steps=20" in caplog.text

    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == f"run directory: {run.resolve()}"
    closing = messages[-1]
    assert closing.startswith("run finished: step 8/8 in ")
    assert f"train loss {logged[-1]['train/loss']:.4f} | val loss {summary['final_val_loss']:.4f}" in closing
    assert f"checkpoint  {run / 'checkpoints' / 'step_0000008.pt'}" in closing
    assert "W&B         off (logger=none)" in closing and "routing     no alerts" in closing
    saved = json.loads((run / "summary.json").read_text())
    assert saved["final_train_loss"] == logged[-1]["train/loss"] and saved["max_steps"] == 8
    # the tokenizer one-liners of docs/guides/training.md: load_model's tokenizer gives ids, as the run's tokenizer.json does
    from tokenizers import Tokenizer as HFTokenizer
    _, tok, _ = load_model(run)
    ids = tok.encode("ROMEO: Good morrow.")
    assert ids and all(isinstance(i, int) for i in ids) and tok.decode(ids) == "ROMEO: Good morrow."
    assert HFTokenizer.from_file(str(run / "tokenizer" / "tokenizer.json")).encode("ROMEO: Good morrow.").ids == ids


def test_each_step_is_train_step_then_evaluate_and_log_then_checkpoint_if_due(reference, tmp_path, monkeypatch):
    """The loop is its named steps, in order, once per optimizer step; a stop is decided after the
    logging and passed to the checkpoint (the step's own checkpoint on the last one)."""
    calls = []
    for name in ("train_step", "evaluate_and_log", "checkpoint_if_due"):
        method = getattr(loop.Trainer, name)

        def traced(self, *args, _name=name, _method=method):
            calls.append((_name, self.step, *(args if _name == "checkpoint_if_due" else ())))
            return _method(self, *args)
        monkeypatch.setattr(loop.Trainer, name, traced)
    s = train(composed_cfg(reference.cache, "train.stop_after=3"), tmp_path / "run")
    assert s["step"] == 3
    assert calls == [("train_step", 0), ("evaluate_and_log", 1), ("checkpoint_if_due", 1, False),
                     ("train_step", 1), ("evaluate_and_log", 2), ("checkpoint_if_due", 2, False),
                     ("train_step", 2), ("evaluate_and_log", 3), ("checkpoint_if_due", 3, True)]
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step_0000003.pt"]
