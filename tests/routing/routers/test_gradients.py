"""Router losses checked by gradient, not only by value: for every registered router, the autograd
gradient of (its loss + a random linear function of its combine weights) with respect to the gate
weight equals that of a plain float64 reimplementation written here (per-expert Python counts,
`log(sum(exp))`, explicit per-sequence loops), and `torch.autograd.gradcheck` passes on each loss
term in float64. The selection itself (which experts) is not differentiable: the reference takes
it from the router's output and recomputes everything that carries a gradient.

A balance loss whose router-probability term is detached has the same value and no gradient to
the router: `test_detached_router_probability_mutant_is_caught` plants exactly that mutant.
"""

import pytest
import torch

from moe.routing.routers import ROUTERS, build_router
from moe.routing.routers import router_config
from moe.routing.routers import base as router_base
from moe.routing.routers.aux_free import sequence_balance_loss
from moe.routing.routers.base import load_balancing_loss, z_loss

T, D, E, SEQ = 12, 8, 4, 6
COEFS = dict(aux_loss_coef=0.5, z_loss_coef=0.1)  # large enough that each term moves the gradient

# One config per registered router (a new router must be added here: see the completeness test).
CONFIGS = {
    "topk": dict(top_k=2, renormalize=True, capacity_factor=1.0),  # capacity drops some assignments
    "switch": dict(top_k=1, renormalize=False, capacity_factor=1.25, jitter=0.0),  # (switch's default jitter is 0.01)
    "sinkhorn": dict(top_k=2, renormalize=False, sinkhorn_iters=3),
    "expert_choice": dict(top_k=2, renormalize=True, capacity_factor=1.0),
    "aux_free": dict(top_k=2, renormalize=True, score_func="sigmoid", seq_aux_loss_coef=0.3),
    "hash": dict(top_k=2),
    # "<router>-<variant>": the same router with another option (a softmax over the token's experts,
    # not over the tokens: rules out the wrong softmax dim, which the sigmoid default never reaches)
    "aux_free-softmax": dict(top_k=2, renormalize=False, score_func="softmax", seq_aux_loss_coef=0.3),
}


def test_every_router_has_a_gradient_case():
    assert {case.partition("-")[0] for case in CONFIGS} == set(ROUTERS)


def make_router(case):
    torch.manual_seed(0)
    name = case.partition("-")[0]
    router = build_router(router_config(name=name, **COEFS, **CONFIGS[case]), D, E).train()
    torch.nn.init.normal_(router.weight, std=0.5)
    return router


def reference_objective(name, cfg, W, x, out, c_TK):
    """Float64 reimplementation of router loss + sum(weights * c) given the router's selection."""
    logits = x @ W.T / cfg.temperature
    if getattr(cfg, "score_func", "softmax") == "sigmoid":
        scores = 1 / (1 + torch.exp(-logits))
        probs = scores / scores.sum(dim=1, keepdim=True)
    else:
        scores = probs = torch.exp(logits) / torch.exp(logits).sum(dim=1, keepdim=True)
    sel = out.selected_TK.tolist()
    kept = out.experts_TK.tolist()
    # combine weights: the chosen experts' scores, renormalised over the token's choices, zero if dropped
    total = W.new_zeros(())
    for t in range(T):
        chosen = [e for e in sel[t] if e < E]
        denom = sum(scores[t, e] for e in chosen) if cfg.renormalize else 1.0
        for k, e in enumerate(sel[t]):
            if kept[t][k] < E:
                total = total + c_TK[t, k] * scores[t, e] / denom
    loss = W.new_zeros(())
    if name != "expert_choice":  # expert choice is balanced by construction: no balance loss
        counts = [sum(row.count(e) for row in sel) for e in range(E)]
        f = [n / (T * len(sel[0])) for n in counts]
        loss = loss + cfg.aux_loss_coef * E * sum(f[e] * probs[:, e].mean() for e in range(E))
    loss = loss + cfg.z_loss_coef * (torch.log(torch.exp(logits).sum(dim=1)) ** 2).mean()
    if getattr(cfg, "seq_aux_loss_coef", 0.0):
        K, per_seq = len(sel[0]), []
        for b in range(T // SEQ):
            rows = sel[b * SEQ:(b + 1) * SEQ]
            f = [E / (K * SEQ) * sum(r.count(e) for r in rows) for e in range(E)]
            per_seq.append(sum(f[e] * probs[b * SEQ:(b + 1) * SEQ, e].mean() for e in range(E)))
        loss = loss + cfg.seq_aux_loss_coef * sum(per_seq) / len(per_seq)
    return loss + total


def router_and_reference_grads(case):
    router = make_router(case)
    name = case.partition("-")[0]
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(1))
    kw = dict(seq_len=SEQ) if router.uses_seq_len else {}
    ids = dict(token_ids_T=torch.arange(T)) if router.uses_token_ids else {}
    out = router(x, **ids, **kw)
    c_TK = torch.randn(out.weights_TK.shape, generator=torch.Generator().manual_seed(2))
    objective = out.loss + (out.weights_TK * c_TK).sum()
    if not router.learned:
        return router, objective, None, None
    (g,) = torch.autograd.grad(objective, router.weight)
    W = router.weight.detach().double().requires_grad_(True)
    ref = reference_objective(name, router.cfg, W, x.double(), out, c_TK.double())
    (g_ref,) = torch.autograd.grad(ref, W)
    assert torch.allclose(objective.double(), ref, atol=1e-5), (float(objective), float(ref))
    return router, objective, g, g_ref


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_router_gradients_match_a_plain_reference(name):
    router, objective, g, g_ref = router_and_reference_grads(name)
    if not router.learned:  # hash routing: a frozen gate, no router loss, nothing to differentiate
        assert not router.weight.requires_grad and float(router(torch.randn(T, D), torch.arange(T)).loss) == 0
        return
    assert g.abs().max() > 1e-3
    torch.testing.assert_close(g.double(), g_ref, atol=1e-5, rtol=1e-4)


def test_detached_router_probability_mutant_is_caught(monkeypatch):
    """Mutant: `P_E = probs_TE.detach().mean(0)` in the balance loss (same value, no gradient)."""
    def detached(probs_TE, experts_TK, n_experts):
        return load_balancing_loss(probs_TE.detach(), experts_TK, n_experts)

    monkeypatch.setattr(router_base, "load_balancing_loss", detached)
    _, _, g, g_ref = router_and_reference_grads("topk")
    assert not torch.allclose(g.double(), g_ref, atol=1e-5, rtol=1e-4)


def test_loss_terms_pass_gradcheck_in_float64():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, E, dtype=torch.float64, generator=g).requires_grad_(True)
    experts = torch.tensor([[0, 1], [1, 2], [1, 3], [0, 1], [2, 1], [3, 0]])
    torch.autograd.gradcheck(lambda lg: load_balancing_loss(torch.softmax(lg, -1), experts, E), (logits,))
    torch.autograd.gradcheck(z_loss, (logits,))
    torch.autograd.gradcheck(lambda lg: sequence_balance_loss(torch.softmax(lg, -1), experts, E, 3), (logits,))
    # with a sentinel (dropped) id in the selection, which must not count
    dropped = experts.clone()
    dropped[0, 1] = E
    torch.autograd.gradcheck(lambda lg: sequence_balance_loss(torch.softmax(lg, -1), dropped, E, 3), (logits,))
