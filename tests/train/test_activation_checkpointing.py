"""`train.activation_checkpointing=full`: the same losses and gradients as without it, far fewer
tensors kept for backward, the same router state, and the same training run end to end."""

from __future__ import annotations

import pytest
import torch

from moe.config import load_config
from moe.routing.routers import RouterConfig, router_config
from moe.errors import ConfigError
from moe.model import Transformer
from moe.train import train
from moe.train.activation_checkpointing import apply_activation_checkpointing
from tests.conftest import tiny_model_config
from tests.train.test_loop import read_metrics, tiny_cfg


def _model(mode: str, router: RouterConfig) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(n_layers=3, router=router)).train()
    apply_activation_checkpointing(model, mode)
    return model


def _step(model: Transformer, x, y):
    """One forward + backward; returns (loss, aux, grads by name, saved bytes outside / inside blocks)."""
    saved = {"outside": 0, "inside": 0}
    depth = [0]
    handles = [b.register_forward_pre_hook(lambda *a: depth.__setitem__(0, depth[0] + 1)) for b in model.layers]
    handles += [b.register_forward_hook(lambda *a: depth.__setitem__(0, depth[0] - 1)) for b in model.layers]

    def pack(t):
        saved["inside" if depth[0] else "outside"] += t.numel() * t.element_size()
        return t

    torch.manual_seed(1)  # router jitter draws the same noise in both runs
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x, targets=y, return_logits=False)
    out.loss.backward()
    for h in handles:
        h.remove()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.loss.detach(), out.aux_loss.detach(), grads, saved


@pytest.mark.parametrize("router", [router_config(name="topk", top_k=2, jitter=0.05),
                                    router_config(name="aux_free", top_k=2, seq_aux_loss_coef=0.01)],
                         ids=["topk_jitter", "aux_free"])
def test_full_checkpointing_gives_the_same_loss_and_gradients_and_saves_less(router):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 97, (4, 32), generator=g)
    y = torch.randint(0, 97, (4, 32), generator=g)
    plain, ckpt = _model("none", router), _model("full", router)
    assert [n for n, _ in ckpt.named_parameters()] == [n for n, _ in plain.named_parameters()]  # names unchanged
    loss0, aux0, grads0, saved0 = _step(plain, x, y)
    loss1, aux1, grads1, saved1 = _step(ckpt, x, y)
    torch.testing.assert_close(loss1, loss0, rtol=0, atol=0)
    torch.testing.assert_close(aux1, aux0, rtol=0, atol=0)
    assert sorted(grads1) == sorted(grads0)
    for name in grads0:  # the recomputed forward is the same computation: bitwise equal on CPU
        torch.testing.assert_close(grads1[name], grads0[name], rtol=0, atol=0, msg=name)
    # Saved activations: a checkpointed block keeps exactly its inputs (x [B,T,D], cos and sin
    # [B,T,head_dim] fp32, the token ids [B,T] int64); what is saved outside the blocks is unchanged.
    cfg = plain.cfg
    B, T, hd = x.shape[0], x.shape[1], cfg.resolved_head_dim
    inputs_per_block = B * T * cfg.d_model * 4 + 2 * B * T * hd * 4 + B * T * 8
    assert saved1["inside"] == cfg.n_layers * inputs_per_block
    assert saved0["inside"] > 10 * saved1["inside"]
    assert saved1["outside"] == saved0["outside"]
    assert saved1["outside"] + saved1["inside"] < 0.5 * (saved0["outside"] + saved0["inside"])
    # State updated in training forwards (aux_free's load counts) is counted once, not again on recompute.
    for a, b in zip(plain.buffers(), ckpt.buffers()):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_eval_and_no_grad_run_the_plain_forward():
    model = _model("full", router_config(top_k=2))
    x = torch.randint(0, 97, (2, 8))
    ref = _model("none", router_config(top_k=2))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x).logits, ref.eval()(x).logits, rtol=0, atol=0)


def test_with_compile_is_a_config_error():
    with pytest.raises(ConfigError, match=r"train.activation_checkpointing='full' does not work with "
                                          r"train.compile=true yet"):
        load_config({"train": {"activation_checkpointing": "full", "compile": True}})


def test_unknown_mode_is_a_config_error():
    with pytest.raises(ConfigError, match=r"train.activation_checkpointing='some' is not allowed; choose one of "
                                          r"\['none', 'full'\]"):
        apply_activation_checkpointing(_model("none", router_config(top_k=2)), "some")


@pytest.mark.slow  # two short training runs (~5 s of CPU)
def test_training_run_is_the_same_with_checkpointing(tmp_path):
    runs = {}
    for mode in ("none", "full"):
        cfg = tiny_cfg(tmp_path, train=dict(max_steps=3, log_interval=1, eval_interval=3, ckpt_interval=3,
                                            activation_checkpointing=mode, peak_flops=1e9), data=dict(max_chars=30_000))
        train(cfg, tmp_path / mode)
        runs[mode] = read_metrics(tmp_path / mode)
    keys = ["train/loss", "train/grad_norm", "val/loss"]
    for a, b in zip(runs["none"], runs["full"]):
        assert a["step"] == b["step"]
        for k in keys:
            if k in a:
                assert b[k] == pytest.approx(a[k], rel=1e-6), (k, a["step"])
