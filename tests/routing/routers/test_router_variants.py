"""Router variants (switch, aux_free, expert_choice, sinkhorn, hash): each keeps the
promise its docstring makes, and all of them plug into the same model unchanged."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from moe.errors import ConfigError
from moe.model import Transformer
from moe.moe_layer import MoE
from moe.routing.routers import RouterConfig, build_router, router_config
from moe.routing.routers.aux_free import sequence_balance_loss
from moe.routing.routers.base import load_balancing_loss
from moe.routing.routers.expert_choice import expert_choice_capacity
from moe.routing.routers.hash import CHUNK, HASH_SEED, hash_table_rows
from moe.routing.routers.sinkhorn import sinkhorn_plan
from tests.conftest import REPO, tiny_model_config, with_variants

VARIANTS = ["topk", "switch", "aux_free", "expert_choice", "sinkhorn", "hash"]
LEARNED = ["topk", "switch", "aux_free", "expert_choice", "sinkhorn"]


def yaml_cfg(name: str, **over) -> RouterConfig:
    raw = OmegaConf.to_container(OmegaConf.load(REPO / "configs" / "router" / f"{name}.yaml"))
    raw.update(over)
    return router_config(**raw)


def load_imbalance(experts_TK: torch.Tensor, n_experts: int) -> float:
    counts = torch.bincount(experts_TK.flatten(), minlength=n_experts + 1)[:n_experts].float()
    return float(counts.max() / counts.mean())


# ----------------------------------------------------------------------------- switch
def test_switch_is_top1_with_capacity_and_switch_loss():
    r = build_router(yaml_cfg("switch", jitter=0.0), d_model=4, n_experts=2)
    with torch.no_grad():
        r.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [-1.0, 0, 0, 0]]))
    x = torch.zeros(10, 4)
    x[:, 0] = 1.0  # every token prefers expert 0; capacity = ceil(1.25 * 10 / 2) = 7
    out = r(x)
    probs = torch.softmax(x @ r.weight.T, -1)
    assert out.experts_TK.shape == (10, 1)
    assert int(out.n_dropped) == 3 and (out.experts_TK == 0).sum() == 7 and (out.experts_TK == 2).sum() == 3
    assert torch.equal(out.experts_TK[:7, 0], torch.zeros(7, dtype=torch.long))  # earlier tokens first
    torch.testing.assert_close(out.weights_TK[:7, 0], probs[:7, 0])  # raw probability, not renormalised
    assert torch.all(out.weights_TK[7:] == 0)
    # Switch loss: E * sum_i f_i P_i over the (pre-capacity) top-1 choices: f = [1, 0].
    torch.testing.assert_close(out.aux_loss, 2 * probs[:, 0].mean())
    r.eval()
    assert int(r(x).n_dropped) == 0  # inference is dropless


def test_switch_rejects_top_k_and_renormalize_clearly():
    with pytest.raises(ConfigError, match="router.top_k=2: the switch router is top-1"):
        build_router(yaml_cfg("switch", top_k=2), 8, 4)
    with pytest.raises(ConfigError, match="router.renormalize=true"):
        build_router(yaml_cfg("switch", renormalize=True), 8, 4)


# ----------------------------------------------------------------------------- aux_free
def test_aux_free_bias_balances_a_skewed_input_without_any_aux_loss():
    torch.manual_seed(0)
    E, D, T = 8, 16, 512
    r = build_router(yaml_cfg("aux_free", bias_update_rate=0.01, aux_loss_coef=0.0, z_loss_coef=0.0), D, E)
    torch.nn.init.normal_(r.weight, std=0.5)
    x = torch.randn(T, D)
    x[:, :4] += 1.5  # a fixed, skewed input: a few experts win most tokens
    r.train()
    history = []
    for _ in range(120):
        out = r(x)
        assert float(out.loss.detach()) == 0.0  # no loss gradient does the balancing
        history.append(load_imbalance(out.experts_TK, E))
        r.after_step()
    assert history[0] > 2.0
    assert sum(history[-20:]) / 20 < 1.25 < history[0] / 1.6
    # The bias is a persistent buffer, not a parameter the optimizer could touch.
    assert "e_score_correction_bias" in r.state_dict() and "load_counts" not in r.state_dict()
    assert all(p is not r.e_score_correction_bias for p in r.parameters())
    assert float(r.e_score_correction_bias.abs().max()) > 0


def test_aux_free_bias_selects_but_weights_are_unbiased_scores():
    torch.manual_seed(1)
    r = build_router(yaml_cfg("aux_free"), d_model=6, n_experts=4)
    torch.nn.init.normal_(r.weight)
    with torch.no_grad():
        r.e_score_correction_bias.copy_(torch.tensor([5.0, 5.0, 0.0, 0.0]))  # forces experts {0, 1}
    x = torch.randn(9, 6)
    out = r(x)
    assert torch.equal(out.experts_TK.sort(-1).values, torch.tensor([[0, 1]] * 9))
    s = torch.sigmoid(x @ r.weight.T)[:, :2]
    torch.testing.assert_close(out.weights_TK.sort(-1).values, (s / s.sum(-1, keepdim=True)).sort(-1).values)
    # Only training forwards with autograd count; after_step resets the counts.
    with torch.no_grad():
        r(x)
    r.eval()
    r(x)
    assert float(r.load_counts.sum()) == 18.0
    r.train()(x[:4])  # a second training forward before the step (gradient accumulation) adds to them
    assert float(r.load_counts.sum()) == 26.0
    r.after_step()
    assert float(r.load_counts.sum()) == 0.0
    bias = r.e_score_correction_bias.clone()
    r.after_step()  # no forward since the last step: nothing to balance
    assert torch.equal(bias, r.e_score_correction_bias)


def test_aux_free_sequence_loss_hand_computed():
    # 2 sequences of 2 tokens, 2 experts, top-1.
    probs = torch.tensor([[0.9, 0.1], [0.7, 0.3], [0.2, 0.8], [0.4, 0.6]])
    experts = torch.tensor([[0], [0], [1], [0]])
    # seq 1: f = 2/(1*2) * [2, 0] = [2, 0], P = [0.8, 0.2] -> 1.6
    # seq 2: f = [1, 1], P = [0.3, 0.7] -> 1.0
    assert float(sequence_balance_loss(probs, experts, 2, seq_len=2)) == pytest.approx(1.3)
    # Without sequence structure it is the batch-level Switch loss.
    assert float(sequence_balance_loss(probs, experts, 2)) == pytest.approx(float(load_balancing_loss(probs, experts, 2)))
    r = build_router(yaml_cfg("aux_free", seq_aux_loss_coef=0.5, z_loss_coef=0.0), 6, 4)
    torch.nn.init.normal_(r.weight)
    out = r(torch.randn(8, 6), seq_len=4)
    assert float(out.loss.detach()) > 0


def test_aux_free_sequence_loss_names_a_ragged_batch_and_keeps_the_probs_dtype():
    probs = torch.softmax(torch.randn(6, 3), dim=-1)
    experts = torch.tensor([[0], [1], [2], [0], [1], [3]])  # 3 = the sentinel (a dropped assignment)
    with pytest.raises(ConfigError, match="6 routed tokens are not a whole number of sequences of length 4"):
        sequence_balance_loss(probs, experts, 3, seq_len=4)
    # bf16 probabilities give a bf16 loss (the counts are built in the probs' dtype, not fp32),
    # equal to the fp32 loss to bf16 precision; the sentinel column is never counted.
    lo = sequence_balance_loss(probs.bfloat16(), experts, 3, seq_len=3)
    assert lo.dtype == torch.bfloat16
    ref = sequence_balance_loss(probs, experts, 3, seq_len=3)
    assert float(lo) == pytest.approx(float(ref), rel=1e-2)


def test_aux_free_tokens_whose_scores_all_underflow_get_zero_weights_and_finite_losses():
    """Sigmoid scores underflow to exactly 0 below logits of ~-104 in fp32: such a token gets
    combine weights 0 (not 0 / 0 = NaN), and its normalised affinities are 0 too, so the balance
    losses and metrics stay finite."""
    r = build_router(yaml_cfg("aux_free", seq_aux_loss_coef=0.1, aux_loss_coef=0.01), 2, 4).train()
    with torch.no_grad():
        r.weight.copy_(torch.tensor([[1.0, 0.0], [1.1, 0.0], [1.2, 0.0], [1.3, 0.0]]))
    x = torch.tensor([[-200.0, 0.0], [1.0, 0.0], [-2.0, 0.0], [0.5, 0.0]])
    out = r(x, seq_len=2)
    assert torch.equal(out.weights_TK[0], torch.zeros(2)) and torch.equal(out.probs_TE[0], torch.zeros(4))
    torch.testing.assert_close(out.weights_TK[1].sum(), torch.tensor(1.0))
    # every other token's affinities are its scores over their sum, a distribution even where the
    # scores sum to well below 1 (token 2: ~0.37)
    scores = torch.sigmoid(x @ r.weight.T)
    assert float(scores[2].sum()) < 0.5
    torch.testing.assert_close(out.probs_TE[1:], scores[1:] / scores[1:].sum(-1, keepdim=True))
    assert torch.isfinite(out.loss) and torch.isfinite(out.aux_loss)


# ----------------------------------------------------------------------------- expert_choice
def test_expert_choice_capacity_defaults_to_factor_one_and_is_at_most_the_batch():
    # C = ceil(cf * T * k / E): None means cf = 1.0 (not 2.0, not an error), another factor is used
    # as given, and no expert takes more tokens than the batch has.
    assert expert_choice_capacity(40, 2, 6, None) == expert_choice_capacity(40, 2, 6, 1.0) == 14
    assert expert_choice_capacity(40, 2, 6, 1.5) == 20
    assert expert_choice_capacity(40, 2, 6, 10.0) == 40
    torch.manual_seed(4)
    r = build_router(yaml_cfg("expert_choice", top_k=2, capacity_factor=1.5), 8, 6)
    torch.nn.init.normal_(r.weight)
    counts = torch.bincount(r(torch.randn(40, 8)).experts_TK.flatten(), minlength=7)
    assert counts[:6].tolist() == [20] * 6  # the router uses the configured factor


def test_expert_choice_gives_every_expert_exactly_its_capacity():
    torch.manual_seed(2)
    E, D, T, k = 6, 8, 40, 2
    r = build_router(yaml_cfg("expert_choice", top_k=k, capacity_factor=1.0), D, E)
    torch.nn.init.normal_(r.weight)
    x = torch.randn(T, D)
    x[:, 0] += 3.0  # skewed: token choice would overload some experts
    out = r(x)
    C = expert_choice_capacity(T, k, E, 1.0)
    assert C == math.ceil(T * k / E)
    assert out.experts_TK.shape == (T, E)
    counts = torch.bincount(out.experts_TK.flatten(), minlength=E + 1)
    assert counts[:E].tolist() == [C] * E
    chosen = out.experts_TK < E
    # Slot e holds e or the sentinel; weights are the softmax scores where chosen.
    assert torch.equal(out.experts_TK[chosen], torch.arange(E).expand(T, E)[chosen])
    torch.testing.assert_close(out.weights_TK[chosen], out.probs_TE[chosen])
    assert torch.all(out.weights_TK[~chosen] == 0)
    assert int(out.n_dropped) == int((~chosen.any(-1)).sum())
    assert float(out.aux_loss) == 0.0


def test_expert_choice_eval_is_per_token_topk_and_causal():
    torch.manual_seed(3)
    cfg = yaml_cfg("expert_choice", renormalize=True)
    r = build_router(cfg, 8, 4)
    torch.nn.init.normal_(r.weight)
    topk = build_router(router_config(top_k=2), 8, 4)
    topk.load_state_dict(r.state_dict())
    x = torch.randn(12, 8)
    r.eval()
    out, ref = r(x), topk(x)
    assert torch.equal(out.experts_TK, ref.experts_TK)
    torch.testing.assert_close(out.weights_TK, ref.weights_TK)
    # Eval keeps expert choice's losses: no balance loss (0, not top-k's Switch loss, which is
    # > 0 here), the z-loss of the same logits, and no capacity drops.
    assert float(out.aux_loss) == 0.0 and float(ref.aux_loss) > 0
    torch.testing.assert_close(out.z_loss, ref.z_loss)
    assert float(out.z_loss) > 0
    torch.testing.assert_close(out.loss, cfg.z_loss_coef * ref.z_loss)
    # Whole model, eval mode: changing future tokens never changes earlier logits.
    torch.manual_seed(0)
    model = Transformer(with_variants(tiny_model_config(), cfg, "sdpa", "sorted")).eval()
    a = torch.randint(0, 97, (2, 16))
    b = a.clone()
    b[:, 8:] = torch.randint(0, 97, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(model(a).logits[:, :8], model(b).logits[:, :8])
    # ...while in training mode the expert's choice over the batch is not causal: a token's
    # experts depend on the other tokens (the documented leak).
    r.train()
    x2 = x.clone()
    x2[6:] = 10 * torch.randn(6, 8)
    assert not torch.equal(r(x).experts_TK[:6], r(x2).experts_TK[:6])


# ----------------------------------------------------------------------------- sinkhorn
def test_sinkhorn_training_assignment_is_near_uniform_on_skewed_logits():
    torch.manual_seed(4)
    E, D, T = 8, 16, 512
    r = build_router(yaml_cfg("sinkhorn"), D, E)
    x = torch.randn(T, D)
    x[:, 0] = 1.0
    with torch.no_grad():
        r.weight.normal_(std=0.25)  # random logits of std ~1...
        r.weight[:, 0] = torch.linspace(3.0, 0.0, E)  # ...plus a per-expert offset (feature 0 is 1)
    r.train()
    out = r(x)
    r.eval()
    plain = r(x)
    assert load_imbalance(plain.experts_TK, E) > 2.0  # greedy top-k is badly skewed here
    assert load_imbalance(out.experts_TK, E) < 1.15
    # Combine weights come from the original softmax, renormalised over the chosen k.
    p = torch.softmax(x @ r.weight.T, -1).gather(1, out.experts_TK)
    torch.testing.assert_close(out.weights_TK, p / p.sum(-1, keepdim=True))
    # The plan's expert marginals are balanced (T / E each).
    plan = sinkhorn_plan(x @ r.weight.T, 8).exp()
    torch.testing.assert_close(plan.sum(0), torch.full((E,), T / E), rtol=1e-4, atol=1e-3)


# ----------------------------------------------------------------------------- hash
def test_hash_is_deterministic_and_depends_only_on_token_ids():
    cfg = yaml_cfg("hash", top_k=2)
    a, b = build_router(cfg, 8, 6), build_router(cfg, 8, 6)
    ids = torch.tensor([0, 5, 5, 3000, 17, 0])
    out_a = a(torch.randn(6, 8), ids)
    out_b = b(torch.randn(6, 8) * 100, ids)  # different hidden states, another instance
    assert torch.equal(out_a.experts_TK, out_b.experts_TK)
    assert torch.equal(out_a.experts_TK[1], out_a.experts_TK[2]) and torch.equal(out_a.experts_TK[0], out_a.experts_TK[5])
    assert torch.all(out_a.experts_TK[:, 0] != out_a.experts_TK[:, 1])  # k distinct experts
    assert torch.all(out_a.weights_TK == 0.5) and float(out_a.loss) == 0.0
    r_eval = build_router(cfg, 8, 6).eval()
    assert torch.equal(r_eval(torch.randn(6, 8), ids).experts_TK, out_a.experts_TK)
    # The table grew to cover id 3000; rows do not depend on how far it grew.
    assert a.table.shape[0] == 3 * CHUNK
    small = build_router(cfg, 8, 6)
    assert torch.equal(small.table, a.table[:CHUNK])
    small.load_state_dict(a.state_dict())  # a checkpoint with a longer table loads
    assert torch.equal(small.table, a.table)
    assert not a.learned and not any(p.requires_grad for p in a.parameters())
    # The errors name the call and the counts, word for word.
    with pytest.raises(ValueError) as e:
        a(torch.randn(6, 8))
    assert str(e.value) == ("the hash router routes by token id: call router(x_TD, token_ids_T) "
                            "(the MoE layer passes the model's input_ids)")
    with pytest.raises(ConfigError) as e:
        a(torch.randn(4, 8), ids)
    assert str(e.value) == "hash router got 6 token ids for 4 tokens"


# ----------------------------------------------------------------------------- all variants
@pytest.mark.parametrize("name", LEARNED)
def test_lm_loss_gradient_reaches_every_learned_router(name):
    torch.manual_seed(0)
    cfg = yaml_cfg(name, aux_loss_coef=0.0, z_loss_coef=0.0, jitter=0.0,
                   **(dict(seq_aux_loss_coef=0.0) if name == "aux_free" else {}))
    model = Transformer(with_variants(tiny_model_config(), cfg, "sdpa", "sorted"))
    x = torch.randint(0, 97, (2, 16))
    out = model(x, targets=x)
    out.lm_loss.backward()
    routers = [b.ffn.router for b in model.layers]
    for r in routers:
        assert r.learned and r.weight.grad is not None and float(r.weight.grad.abs().sum()) > 0, name


def test_switching_the_variant_changes_no_other_weight():
    states = {}
    for name in VARIANTS:
        torch.manual_seed(0)
        states[name] = Transformer(with_variants(tiny_model_config(), yaml_cfg(name), "sdpa", "sorted")).state_dict()
    ref = states["topk"]
    for name, sd in states.items():
        for key, value in ref.items():
            assert torch.equal(sd[key], value), (name, key)  # the gate included (same init stream)
        extra = set(sd) - set(ref)
        assert all(".ffn.router." in k for k in extra), (name, extra)


@pytest.mark.parametrize("name", VARIANTS)
def test_identical_experts_give_the_topk_output_scaled_by_the_weight_sum(name):
    torch.manual_seed(5)
    mcfg = tiny_model_config()
    layer = MoE(with_variants(mcfg, yaml_cfg(name, jitter=0.0), experts="sorted"))
    ref = MoE(with_variants(mcfg, router_config(top_k=layer.router.top_k), experts="sorted"))
    for m in (layer, ref):
        torch.nn.init.normal_(m.experts.gate_up_proj, std=0.2)
        torch.nn.init.normal_(m.experts.down_proj, std=0.2)
    with torch.no_grad():
        for m in (layer, ref):  # every expert is expert 0 of the reference layer
            m.experts.gate_up_proj.copy_(ref.experts.gate_up_proj[:1].expand_as(m.experts.gate_up_proj))
            m.experts.down_proj.copy_(ref.experts.down_proj[:1].expand_as(m.experts.down_proj))
        torch.nn.init.normal_(ref.router.weight)
        layer.router.weight.copy_(ref.router.weight)
    x = torch.randn(2, 16, mcfg.d_model)
    ids = torch.randint(0, 97, (2, 16))
    for mode in ("train", "eval"):
        layer.train(mode == "train")
        ref.train(mode == "train")
        y_ref = ref(x, ids)[0].reshape(-1, mcfg.d_model)  # renormalised top-k: weights sum to 1
        y, _, _ = layer(x, ids)
        route = layer.router(x.reshape(-1, mcfg.d_model), ids.reshape(-1))
        wsum = route.weights_TK.sum(-1, keepdim=True)
        torch.testing.assert_close(y.reshape(-1, mcfg.d_model), wsum * y_ref, rtol=1e-5, atol=1e-6)
        if name in ("topk", "aux_free", "sinkhorn", "hash"):  # renormalised, dropless: exactly topk's output
            torch.testing.assert_close(y.reshape(-1, mcfg.d_model), y_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", VARIANTS)
def test_full_model_loop_and_sorted_dispatch_agree(name):
    cfg = yaml_cfg(name)
    outs = {}
    for dispatch in ("loop", "sorted"):
        torch.manual_seed(0)
        model = Transformer(with_variants(tiny_model_config(), cfg, "sdpa", dispatch))
        x = torch.randint(0, 97, (2, 24))
        torch.manual_seed(1)  # the same jitter noise for both
        out = model(x, targets=x)
        out.loss.backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        outs[dispatch] = (out.logits.detach(), out.loss.detach(), grads)
    (la, lossa, ga), (lb, lossb, gb) = outs["loop"], outs["sorted"]
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lossa, lossb, rtol=1e-5, atol=1e-6)
    assert ga.keys() == gb.keys() and len(ga) > 0
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], rtol=1e-4, atol=1e-6, msg=lambda m: f"{name} {k}: {m}")


def test_expert_choice_ranks_tokens_by_softmax_score_not_logit():
    """Each expert takes its C tokens with the highest score S = softmax over experts. Rules out
    ranking by the raw gate logit (or by a softmax over the tokens of a column, which orders them
    the same way): token A has high logits for both experts (5, 4.9), token B (0, -3). Expert 0's
    logits prefer A (5 > 0) but its softmax scores prefer B (0.95 > 0.52): with C = 1, expert 0
    must take B."""
    r = build_router(yaml_cfg("expert_choice", top_k=1, capacity_factor=1.0, renormalize=False), 2, 2)
    with torch.no_grad():
        r.weight.copy_(torch.eye(2))  # logits = x
    x = torch.tensor([[5.0, 4.9], [0.0, -3.0]])  # token A, token B
    out = r.train()(x)
    assert expert_choice_capacity(2, 1, 2, 1.0) == 1
    assert out.experts_TK.tolist() == [[2, 1], [0, 2]]  # A -> expert 1 only, B -> expert 0 only


def test_hash_table_is_the_documented_seeded_permutation_prefix_and_probs_are_one_over_k():
    """Chunk c of the table is the k-prefix of a random permutation per id from a generator seeded
    HASH_SEED + c (rules out another seed rule, or a table that starts at another chunk); the
    routing distribution is 1/k on the k experts (sums to 1); the balance loss is the Switch loss
    of that distribution."""
    E, k = 6, 2

    def chunk(c):  # the docstring's rule, written out
        g = torch.Generator().manual_seed(HASH_SEED + c)
        return torch.rand(CHUNK, E, generator=g).argsort(dim=1)[:, :k]

    r = build_router(yaml_cfg("hash", top_k=k), 8, E)
    assert torch.equal(r.table, chunk(0))
    ids = torch.tensor([3, CHUNK + 7, 2 * CHUNK + 1])
    out = r(torch.randn(3, 8), ids)
    assert torch.equal(r.table, torch.cat([chunk(0), chunk(1), chunk(2)]))
    assert torch.equal(hash_table_rows(1, 2, E, k), torch.cat([chunk(1), chunk(2)]))
    assert torch.equal(out.experts_TK, torch.stack([chunk(0)[3], chunk(1)[7], chunk(2)[1]]))
    assert out.probs_TE.sum(-1).tolist() == [1.0] * 3
    assert torch.equal(out.probs_TE.gather(1, out.experts_TK), torch.full((3, k), 1 / k))
    torch.testing.assert_close(out.aux_loss, load_balancing_loss(out.probs_TE, out.experts_TK, E))
    with pytest.raises(ConfigError, match=r"^router.n_groups: not an option of router.name='hash'"):
        yaml_cfg("hash", n_groups=2)  # group-limited routing does not apply to hash routing


# ----------------------------------------------------------------------------- contracts the variants share
@pytest.mark.parametrize("name", ["topk", "switch", "aux_free", "sinkhorn", "hash"])
def test_token_choice_variants_apply_capacity_in_training_only(name):
    """A capacity factor drops over-capacity assignments in training, and eval routes dropless
    (rules out applying capacity always, or never)."""
    torch.manual_seed(0)
    E, T = 4, 32
    r = build_router(yaml_cfg(name, capacity_factor=0.5), 8, E)
    if r.learned:
        torch.nn.init.normal_(r.weight)
    x, ids = torch.randn(T, 8), torch.randint(0, 50, (T,))
    tr = r.train()(x, ids)
    ev = r.eval()(x, ids)
    # 0.5 * T * k / E slots per expert hold half the T * k assignments at most
    assert int(tr.n_dropped) >= T * r.top_k // 2 and int((tr.experts_TK == E).sum()) == int(tr.n_dropped)
    assert int(ev.n_dropped) == 0 and not (ev.experts_TK == E).any()


@pytest.mark.parametrize("name", ["switch", "aux_free", "sinkhorn"])
def test_group_limited_variants_keep_each_token_in_its_best_groups(name):
    """n_groups / topk_groups restrict a token's experts to its best group(s), scored on what the
    variant selects by. With top-2 and one group kept, both experts are in one group (this
    example has tokens whose unrestricted top-2 spans two groups); switch is top-1, where a group
    scored by its best expert always holds the global best, so the limit leaves it unchanged."""
    torch.manual_seed(5)
    E, G, T = 8, 4, 64
    plain = build_router(yaml_cfg(name), 8, E)
    torch.nn.init.normal_(plain.weight)
    limited = build_router(yaml_cfg(name, n_groups=G, topk_groups=1), 8, E)
    limited.load_state_dict(plain.state_dict())
    x = torch.randn(T, 8)
    for mode in ("train", "eval"):
        a, b = getattr(plain, mode)()(x), getattr(limited, mode)()(x)
        if name == "switch":
            assert torch.equal(a.experts_TK, b.experts_TK)
            continue
        group_a, group_b = a.experts_TK // (E // G), b.experts_TK // (E // G)
        assert (group_a[:, 0] != group_a[:, 1]).any()
        assert torch.equal(group_b[:, 0], group_b[:, 1])


# Each variant's option checks, word for word: the message names the field, its value and what
# to set instead (a reworded, emptied or dropped message fails here).
VARIANT_ERRORS = [
    ("switch", dict(top_k=2), "router.top_k=2: the switch router is top-1 by definition (Fedus et al. 2021); "
                              "set router.top_k=1 or use router=topk"),
    ("switch", dict(renormalize=True), "router.renormalize=true: with top-1 every weight would become 1.0 and the "
                                       "router would get no gradient from the LM loss; the switch router uses the "
                                       "raw probability (set router.renormalize=false)"),
    ("sinkhorn", dict(sinkhorn_iters=0), "router.sinkhorn_iters=0 must be >= 1"),
    ("aux_free", dict(score_func="relu"), "router.score_func='relu' is not allowed; choose one of ['softmax', 'sigmoid']"),
    ("aux_free", dict(bias_update_rate=-0.1), "router.bias_update_rate=-0.1 must be >= 0 (and finite)"),
    ("aux_free", dict(seq_aux_loss_coef=-1.0), "router.seq_aux_loss_coef=-1.0 must be >= 0 (and finite)"),
    ("hash", dict(drop_experts=[1]), "router.drop_experts=[1]: hash routing has a fixed token -> experts table and "
                                     "no gate to remove experts from"),
]


@pytest.mark.parametrize("name,over,message", VARIANT_ERRORS, ids=lambda v: str(v)[:24])
def test_variant_option_errors_name_the_field_and_the_fix(name, over, message):
    with pytest.raises(ConfigError) as e:
        build_router(yaml_cfg(name, **over), 8, 4)
    assert str(e.value) == message


@pytest.mark.parametrize("name,over", [("sinkhorn", dict(sinkhorn_iters=1)), ("aux_free", dict(bias_update_rate=0.0)),
                                       ("aux_free", dict(seq_aux_loss_coef=0.0))])
def test_variant_option_bounds_admit_their_edge(name, over):
    # the smallest allowed value builds a router that routes (">= 1" is not "> 1")
    r = build_router(yaml_cfg(name, **over), 8, 4)
    assert r(torch.randn(5, 8)).experts_TK.shape == (5, r.top_k)
