"""The aux_free router's group limit with DeepSeek-V3's group score, its sequence-wise loss being
computed only when it is used, and its buffers' dtype and device (docs/results/mutation/rerun2/:
the second run's modules re-run; these kill the survivors of that re-run listed there)."""

import pytest
import torch

import moe.routing.routers.aux_free as aux_free
from moe.routing.routers import build_router, router_config
from moe.routing.routers.aux_free import sequence_balance_loss
from tests.routing.routers.group_reference import kept_groups


def _reference_experts(select_TE: torch.Tensor, n_groups: int, topk_groups: int, score_top: int, k: int) -> list:
    """Per token: groups scored by the sum of their best `score_top` selection scores, the best
    `topk_groups` groups kept, then the k best-scored experts among the kept ones."""
    T, E = select_TE.shape
    per = E // n_groups
    out = []
    for t in range(T):
        s = select_TE[t].tolist()
        kept = kept_groups(s, n_groups, topk_groups, score_top)
        allowed = [e for e in range(E) if e // per in kept]
        out.append(sorted(sorted(allowed, key=lambda e: -s[e])[:k]))
    return out


def test_aux_free_group_limit_scores_groups_by_their_best_group_score_top_biased_scores():
    """8 experts in 4 groups, one kept, a group scored by the sum of its best two BIASED sigmoid
    scores: the router's choice equals the reference, and differs in this example both from
    scoring a group by its best expert alone and from keeping two groups."""
    torch.manual_seed(0)
    E, G, T = 8, 4, 64
    r = build_router(router_config("aux_free", top_k=2, n_groups=G, topk_groups=1, group_score_top=2), 16, E).eval()
    torch.nn.init.normal_(r.weight, 0.0, 1.0)
    r.e_score_correction_bias.copy_(torch.linspace(-0.2, 0.2, E))
    x = torch.randn(T, 16)
    out = r(x)
    select = torch.sigmoid(r.logits(x)) + r.e_score_correction_bias
    got = [sorted(row) for row in out.experts_TK.tolist()]
    assert got == _reference_experts(select, G, 1, 2, 2)
    assert got != _reference_experts(select, G, 1, 1, 2)  # a group scored by its best expert only
    assert got != _reference_experts(select, G, 2, 1, 2)  # two groups kept


@pytest.mark.parametrize("coef, training, need_losses, calls", [
    (0.1, True, True, 1),   # training with the loss on: computed once
    (0.0, True, True, 0),   # coefficient 0 means off: not computed at all
    (0.1, False, False, 0),  # the inference path: no losses, so no sequence loss either
])
def test_the_sequence_loss_is_computed_only_when_it_is_used(monkeypatch, coef, training, need_losses, calls):
    seen = []
    real = aux_free.sequence_balance_loss

    def counting(*args, **kwargs):
        seen.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(aux_free, "sequence_balance_loss", counting)
    torch.manual_seed(0)
    r = build_router(router_config("aux_free", top_k=2, seq_aux_loss_coef=coef), 16, 8).train(training)
    torch.nn.init.normal_(r.weight, 0.0, 0.1)  # the model initialises the gate; a bare router's is empty
    out = r(torch.randn(12, 16), seq_len=4, need_losses=need_losses)
    assert len(seen) == calls
    if need_losses:
        assert torch.isfinite(out.loss)
    else:
        assert out.loss is None


def test_bias_and_load_buffers_stay_fp32_under_another_default_dtype():
    """The selection bias and the load counts are fp32 whatever the default dtype the model is
    built under (its sign-step updates of 0.01 would be coarse in bf16)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        r = build_router(router_config("aux_free", top_k=2), 16, 8)
    finally:
        torch.set_default_dtype(old)
    assert r.weight.dtype == torch.float64  # the default really was in force
    assert r.e_score_correction_bias.dtype == torch.float32
    assert r.load_counts.dtype == torch.float32


def test_sequence_balance_loss_follows_its_inputs_device():
    """On a non-CPU device (meta stands for any) the loss is computed there: its count buffer is
    made on the inputs' device, not the default one."""
    probs = torch.softmax(torch.randn(8, 4), dim=-1).to("meta")
    experts = torch.randint(0, 5, (8, 2)).to("meta")
    loss = sequence_balance_loss(probs, experts, 4, 4)
    assert loss.device.type == "meta" and loss.shape == ()
