"""Multi-token prediction modules (moe/mtp.py) in the model: the losses against a plain
re-implementation, gradients against finite differences, every router and expert dispatch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from moe.config import Config, ModelConfig, VariantConfig, validate
from moe.errors import ConfigError
from moe.experts import EXPERT_DISPATCH
from moe.model import Transformer
from moe.mtp import MultiTokenPrediction
from moe.routing.routers import ROUTERS

V = 48


def tiny(depth: int = 2, **kw) -> ModelConfig:
    kw = {"max_seq_len": 32, **kw}
    return ModelConfig(vocab_size=V, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, n_experts=4, expert_hidden=8,
                       mtp_depth=depth, **kw)


def reference_mtp_losses(model: Transformer, ids_BT: torch.Tensor) -> list[torch.Tensor]:
    """DeepSeek-V3's equations on the valid positions only (no padding): depth k at position i
    sees h^{k-1}_i and token t_{i+k} and is scored on t_{i+k+1}."""
    B, T = ids_BT.shape
    cos, sin = model.rotary(torch.arange(T).expand(B, T))
    h = model.embed(ids_BT)
    for block in model.layers:
        h = block(h, cos, sin, ids_BT)[0]
    losses = []
    for k, module in enumerate(model.mtp.layers, start=1):
        n = T - k  # positions with a next-next token inside the sequence ... and their inputs
        emb = model.embed(ids_BT[:, k:])
        x = module.eh_proj(torch.cat([module.enorm(emb), module.hnorm(h[:, :n])], dim=-1))
        h = module.block(x, cos[:, :n], sin[:, :n], ids_BT[:, k:])[0]
        logits = model.lm_head(module.norm(h[:, :n - 1]))
        losses.append(F.cross_entropy(logits.reshape(-1, V).float(), ids_BT[:, k + 1:].reshape(-1)))
    return losses


def test_the_depth_losses_are_deepseek_v3s_equations_and_the_fused_path_agrees():
    torch.manual_seed(0)
    model = Transformer(tiny(depth=3))
    ids = torch.randint(0, V, (2, 12))
    ref = reference_mtp_losses(model, ids)
    plain = model(ids, labels=ids)
    fused = model(ids, labels=ids, return_logits=False)
    assert len(plain.mtp_losses) == 3 and len(plain.mtp_accuracies) == 3
    for a, b, c in zip(ref, plain.mtp_losses, fused.mtp_losses):
        torch.testing.assert_close(b, a)
        torch.testing.assert_close(c, a)
    assert all(0.0 <= float(acc) <= 1.0 for acc in plain.mtp_accuracies)
    # the main loss is untouched by the modules: the same as the model without them, same weights
    main = Transformer(tiny(depth=0))
    main.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("mtp.")})
    torch.testing.assert_close(main(ids, labels=ids).lm_loss, plain.lm_loss)


def test_accuracy_counts_the_argmax_hits_of_the_valid_targets():
    torch.manual_seed(0)
    model = Transformer(tiny(depth=1))
    model.mtp.layers[0].eh_proj.weight.data.zero_()  # h^1 = block(0): the same logits at every position
    ids = torch.randint(0, V, (1, 10))
    out = model(ids, labels=ids)
    h = model.mtp.layers[0].block(torch.zeros(1, 10, 16), *model.rotary(torch.arange(10)[None]), ids)[0]
    pred = model.lm_head(model.mtp.layers[0].norm(h)).argmax(-1)[0, :8]
    torch.testing.assert_close(float(out.mtp_accuracies[0]), float((pred == ids[0, 2:]).float().mean()))


class CausalMixBlock(torch.nn.Module):
    """A stand-in transformer block in float64 end to end (the model's RMSNorm computes in fp32, which
    finite differences cannot resolve): a linear map of the running mean over earlier positions."""

    def __init__(self, d):
        super().__init__()
        self.proj = torch.nn.Linear(d, d, dtype=torch.float64)

    def forward(self, x_BTD, cos, sin, token_ids_BT=None, kv_context=None):
        mean_BTD = x_BTD.cumsum(1) / torch.arange(1, x_BTD.shape[1] + 1, dtype=x_BTD.dtype)[:, None]
        return x_BTD + torch.tanh(self.proj(mean_BTD)), None, None


class Head:
    """The shared LM head as the MTP path uses it (`weight`, a call), over a plain tensor."""

    def __init__(self, weight_VD):
        self.weight = weight_VD

    def __call__(self, h_ND):
        return h_ND @ self.weight.T


def test_gradients_of_the_mtp_path_match_finite_differences():
    """float64: the sum of the depths' losses as a function of the main hidden state, the shared
    embedding and LM head, and each module's projection and block (the plain cross-entropy path);
    the fused path's gradients equal the plain one's."""
    torch.manual_seed(0)
    d, T = 6, 7
    mtp = MultiTokenPrediction(2, d, lambda _k: CausalMixBlock(d),
                               lambda: torch.nn.RMSNorm(d, eps=1e-5, dtype=torch.float64)).double()
    ids = torch.randint(0, V, (2, T))
    targets = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], dim=1)
    names = ["layers.0.eh_proj.weight", "layers.1.eh_proj.weight", "layers.1.block.proj.weight", "layers.0.hnorm.weight"]
    params = dict(mtp.named_parameters())

    def total(h0, emb_w, head_w, *tensors, fused=False):
        out = torch.func.functional_call(mtp, {**params, **dict(zip(names, tensors))},
                                         (h0, ids, targets, lambda t: F.embedding(t, emb_w), Head(head_w), None, None,
                                          fused))
        return torch.stack(out.losses).sum()

    leaves = (torch.randn(2, T, d, dtype=torch.float64), torch.randn(V, d, dtype=torch.float64),
              0.3 * torch.randn(V, d, dtype=torch.float64),
              *(params[n].detach().clone() for n in names))
    inputs = tuple(t.requires_grad_(True) for t in leaves)
    assert total(*inputs).dtype == torch.float64
    assert torch.autograd.gradcheck(total, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)
    plain = torch.autograd.grad(total(*inputs), inputs)
    fused = torch.autograd.grad(total(*inputs, fused=True), inputs)
    for a, b in zip(plain, fused):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


ROUTER_NAMES = sorted(ROUTERS)
DISPATCH = sorted(n for n in EXPERT_DISPATCH if EXPERT_DISPATCH.unavailable_reason(n) is None)


@pytest.mark.parametrize("router", ROUTER_NAMES)
@pytest.mark.parametrize("experts", DISPATCH)
def test_every_router_and_dispatch_trains_the_mtp_modules(router, experts):
    torch.manual_seed(0)
    model = Transformer(tiny(depth=2, router=VariantConfig(name=router), experts=VariantConfig(name=experts)))
    ids = torch.randint(0, V, (2, 16))
    out = model(ids, labels=ids, return_logits=False)
    loss = out.loss + 0.3 * torch.stack(out.mtp_losses).mean()
    loss.backward()
    assert all(torch.isfinite(x) for x in out.mtp_losses)
    for k in range(2):
        g = model.mtp.layers[k].eh_proj.weight.grad
        assert g is not None and g.abs().sum() > 0, (router, experts, k)
        assert model.mtp.layers[k].block.attn.qkv_proj.weight.grad.abs().sum() > 0


def test_the_mtp_blocks_follow_the_last_layers_ffn_and_count_as_parameters():
    moe_last = Transformer(tiny(depth=1))
    dense_last = Transformer(tiny(depth=1, dense_layers=[1]))
    assert moe_last.mtp.layers[0].block.is_moe and not dense_last.mtp.layers[0].block.is_moe
    without = Transformer(tiny(depth=0))
    extra = sum(p.numel() for p in moe_last.mtp.parameters())
    assert moe_last.num_params() == without.num_params() + extra
    per_expert = sum(p.numel() for p in moe_last.mtp.layers[0].block.ffn.experts.parameters()) // 4
    assert moe_last.num_params(active=True) == without.num_params(active=True) + extra - 2 * per_expert


def test_a_loss_coefficient_without_modules_is_one_config_error():
    cfg = Config(model=tiny(depth=0, max_seq_len=128))
    cfg.train.mtp_loss_coef = 0.3
    with pytest.raises(ConfigError, match=r"train.mtp_loss_coef=0.3 needs MTP modules: set model.mtp_depth >= 1"):
        validate(cfg)
    cfg = Config(model=tiny(depth=1, max_seq_len=128))
    cfg.train.mtp_loss_coef_after = 0.1
    with pytest.raises(ConfigError, match="set both"):
        validate(cfg)
    cfg.train.mtp_loss_switch_step = 10
    cfg.train.mtp_loss_coef = 0.3
    assert validate(cfg) is cfg
    with pytest.raises(ConfigError, match="model.mtp_depth=-1"):
        validate(Config(model=tiny(depth=-1, max_seq_len=128)))
