"""Routing probes: train/inference overlap and routing stability, measured without
consuming training randomness or changing any model state; and their trainer logging."""

import json

import pytest
import torch

from moe.config import load_config
from moe.routing.routers import RouterConfig, router_config
from moe.model import Transformer
from moe.routing.probe import (RoutingProbe, eval_selections, routing_stability, selection_mask,
                               train_eval_overlap)
from moe.train import train
from tests.conftest import SHARED_DATA, tiny_model_config, with_variants
from tests.routing.routers.test_router_variants import yaml_cfg


def model_with(router_cfg: RouterConfig) -> Transformer:
    torch.manual_seed(0)
    return Transformer(with_variants(tiny_model_config(), router_cfg, "sdpa", "sorted"))


def test_selection_mask_ignores_sentinels():
    experts = torch.tensor([[1, 0], [3, 2], [1, 3]])  # 3 = sentinel with 3 experts
    mask = selection_mask(experts, 3)
    assert mask.tolist() == [[True, True, False], [False, False, True], [False, True, False]]


def test_overlap_consumes_no_rng_and_changes_no_state():
    model = model_with(yaml_cfg("aux_free", jitter=0.3))
    model.train()
    x = torch.randint(0, 97, (2, 16))
    torch.manual_seed(123)
    expected = torch.rand(5)
    torch.manual_seed(123)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    counts = [b.ffn.router.load_counts.clone() for b in model.layers]
    m = train_eval_overlap(model, x)
    assert torch.equal(torch.rand(5), expected)  # the RNG stream is untouched
    assert model.training and all(mod.training for mod in model.modules())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert all(torch.equal(c, b.ffn.router.load_counts) for c, b in zip(counts, model.layers))
    assert set(m) == {"moe/train_eval_overlap", "moe/layer0/train_eval_overlap", "moe/layer1/train_eval_overlap"}
    assert 0.0 <= m["moe/train_eval_overlap"] < 1.0  # 30% jitter changes some choices
    model.eval()
    train_eval_overlap(model, x)
    assert not model.training


def test_overlap_is_one_without_training_only_effects_and_lower_for_expert_choice():
    x = torch.randint(0, 97, (4, 16))
    assert train_eval_overlap(model_with(router_config(top_k=2)), x)["moe/train_eval_overlap"] == 1.0
    assert train_eval_overlap(model_with(yaml_cfg("hash")), x)["moe/train_eval_overlap"] == 1.0
    assert train_eval_overlap(model_with(yaml_cfg("expert_choice")), x)["moe/train_eval_overlap"] < 0.9


def test_stability_between_checkpoints():
    model = model_with(router_config(top_k=2))
    probe_ids = torch.randint(0, 97, (2, 16))
    probe = RoutingProbe(model, probe_ids)
    assert probe.stability() == {}
    assert probe.stability()["moe/routing_stability"] == 1.0  # same weights: same sets
    with torch.no_grad():
        model.layers[1].ffn.router.weight.normal_()  # a different router in layer 1 only
    m = probe.stability()
    assert m["moe/layer0/routing_stability"] == 1.0 and m["moe/layer1/routing_stability"] < 1.0
    restored = RoutingProbe(model, probe_ids)
    restored.load_state_dict(probe.state_dict())
    assert restored.stability()["moe/routing_stability"] == 1.0
    sel = eval_selections(model, probe_ids)
    with pytest.raises(ValueError, match="not the same probe batch"):
        routing_stability(sel, [s[:3] for s in sel])


def test_trainer_logs_probes_and_aux_free_resume_is_exact(tmp_path):
    def cfg(**train_over):
        return load_config({
            "model": dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=16,
                          max_seq_len=32),
            "router": dict(name="aux_free", score_func="sigmoid", aux_loss_coef=0.0, bias_update_rate=0.01,
                           jitter=0.05),
            "data": dict(name="text", path=str(SHARED_DATA / "corpus" / "tinystories_train_head.txt"),
                         vocab_size=300, max_chars=20_000, cache_dir=str(tmp_path / "cache"), num_proc=1),
            "train": dict(batch_size=4, seq_len=16, max_steps=6, log_interval=2, eval_interval=3, eval_batches=1,
                          ckpt_interval=2, keep_last=5, peak_flops=1e12, **train_over),  # see below
            "optim": dict(warmup_steps=1), "logger": dict(name="none"),
        })

    # train.peak_flops is given because measuring the peak draws from the global torch RNG on
    # its first call in a process (moe/perf.py), which would shift the first run's jitter.

    def metrics(run):
        return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]

    train(cfg(), tmp_path / "full")
    train(cfg(stop_after=4), tmp_path / "part")  # validates at 4, off the eval grid
    train(cfg(resume="auto"), tmp_path / "part")
    a, b = metrics(tmp_path / "full"), metrics(tmp_path / "part")
    logged = [r for r in a if "train/loss" in r]
    assert all("moe/train_eval_overlap" in r and "moe/layer1/train_eval_overlap" in r for r in logged)
    assert [r["step"] for r in a if "moe/routing_stability" in r] == [3, 6]
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for key in ra:
            if key.startswith(("train/", "val/", "moe/")):
                assert ra[key] == rb[key], (ra["step"], key)
    ckpt = torch.load(tmp_path / "part" / "checkpoints" / "step_0000006.pt", weights_only=True)
    assert ckpt["model"]["layers.0.ffn.router.e_score_correction_bias"].abs().sum() > 0
    assert len(ckpt["routing_probe"]["previous"]) == 2
