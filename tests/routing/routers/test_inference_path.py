"""The routers' inference path (`need_losses=False`; `Transformer.forward(need_records=False)`):
for every variant the same experts, weights, probabilities and drop counts as the full path, no
losses and no records, and refused in training mode."""

import pytest
import torch

from moe.model import Transformer
from moe.routing.routers import build_router, router_config
from moe.routing.routers.aux_free import sequence_balance_loss
from tests.conftest import tiny_model_config, with_variants

# Every variant, and the options that change how a token is routed (group limits, dropped experts,
# temperature, aux_free's sequence loss and softmax scores, a capacity factor: dropless at inference).
CASES = [
    ("topk", {}),
    ("topk", dict(n_groups=2, topk_groups=1, group_score_top=2, temperature=0.7, renormalize=False)),
    ("topk", dict(drop_experts=[1], capacity_factor=0.5)),
    ("switch", dict(top_k=1)),
    ("aux_free", dict(seq_aux_loss_coef=1e-3, n_groups=2, topk_groups=1)),
    ("aux_free", dict(score_func="softmax", aux_loss_coef=0.01)),
    ("expert_choice", dict(renormalize=True)),
    ("sinkhorn", dict(n_groups=2, topk_groups=2)),
    ("hash", {}),
]
IDS = [f"{n}-{i}" for i, (n, _) in enumerate(CASES)]


def _router(name, opts, n_experts=4, d=16):
    torch.manual_seed(0)
    r = build_router(router_config(name, **opts), d, n_experts)
    torch.nn.init.normal_(r.weight, 0.0, 0.5)
    if hasattr(r, "e_score_correction_bias"):  # a trained bias that changes the selection
        r.e_score_correction_bias.copy_(torch.tensor([0.3, -0.2, 0.0, 0.1]))
    return r.eval()


def _call(r, x, ids, **kw):
    return r(x, ids, seq_len=x.shape[0] or None, **kw) if r.uses_seq_len else r(x, ids, **kw)


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
@pytest.mark.parametrize("T", [0, 1, 7])  # no tokens, one decoding token, a prefill chunk
def test_router_inference_path_routes_as_the_full_path(name, opts, T):
    r = _router(name, opts)
    g = torch.Generator().manual_seed(T)
    x, ids = torch.randn(T, 16, generator=g), torch.randint(0, 3000, (T,), generator=g)  # ids past one hash chunk
    with torch.no_grad():
        full, lean = _call(r, x, ids), _call(r, x, ids, need_losses=False)
    for field in ("experts_TK", "weights_TK", "probs_TE", "n_dropped", "selected_TK"):
        assert torch.equal(getattr(lean, field), getattr(full, field)), field
    assert lean.experts_TK.shape == (T, full.experts_TK.shape[1])
    assert full.loss is not None and full.aux_loss is not None and full.z_loss is not None
    assert lean.loss is None and lean.aux_loss is None and lean.z_loss is None


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
def test_router_inference_path_is_refused_in_training(name, opts):
    r = _router(name, opts).train()
    with pytest.raises(ValueError, match="need_losses=False"):
        _call(r, torch.randn(5, 16), torch.arange(5), need_losses=False)


def _model(name, opts, **kw):
    torch.manual_seed(0)
    cfg = with_variants(tiny_model_config(n_experts=4, routed_scaling_factor=1.5, n_shared_experts=1,
                                          shared_expert_hidden=8, **kw),
                        router_config(name, **opts))
    return Transformer(cfg).eval()


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
def test_model_without_records_gives_the_same_logits(name, opts):
    m = _model(name, opts)
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        full, lean = m(ids), m(ids, need_records=False)
    assert torch.equal(lean.logits, full.logits)
    assert len(full.moe_records) == 2 and full.aux_loss is not None
    assert lean.moe_records == [] and lean.aux_loss is None


def test_model_without_records_keeps_the_lm_loss_and_refuses_training():
    m = _model("topk", {}, n_dense_layers=1)  # a dense layer before the MoE one
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        full, lean = m(ids, labels=ids), m(ids, labels=ids, need_records=False)
    assert torch.equal(lean.lm_loss, full.lm_loss) and torch.equal(lean.loss, full.lm_loss)
    assert not torch.equal(full.loss, full.lm_loss)  # the full path adds the router losses
    m.train()
    with pytest.raises(ValueError, match="need_records=False.*model.eval"):
        m(ids, need_records=False)


def test_aux_free_inference_path_counts_no_load():
    r = _router("aux_free", {})
    _call(r, torch.randn(6, 16), None, need_losses=False)  # eval, with autograd on
    assert torch.count_nonzero(r.load_counts) == 0


def test_aux_free_sequence_loss_of_no_tokens_is_zero():
    # (it divided by the sequence length 0; the inference path never calls it)
    loss = sequence_balance_loss(torch.zeros(0, 4), torch.zeros(0, 2, dtype=torch.long), 4, None)
    assert loss.shape == () and float(loss) == 0.0
    assert float(sequence_balance_loss(torch.full((2, 4), 0.25), torch.tensor([[0, 1], [2, 3]]), 4, 2)) == 1.0


def test_finish_applies_capacity_the_same_way_without_losses():
    """No variant drops over capacity at inference, but `finish` must route the same either way."""
    r = _router("topk", dict(capacity_factor=0.5))
    experts_TK = torch.tensor([[0, 1], [0, 2], [0, 1], [3, 0]])
    weights_TK, probs_TE = torch.rand(4, 2), torch.softmax(torch.randn(4, 4), -1)
    full = r.finish(experts_TK, weights_TK, probs_TE, probs_TE.log(), apply_capacity=True)
    lean = r.finish(experts_TK, weights_TK, probs_TE, probs_TE.log(), apply_capacity=True, need_losses=False)
    assert int(full.n_dropped) > 0
    for field in ("experts_TK", "weights_TK", "n_dropped", "selected_TK"):
        assert torch.equal(getattr(lean, field), getattr(full, field)), field
    assert torch.equal(full.selected_TK, experts_TK) and lean.loss is None
