"""moe/quant/awq.py, scale by scale (the sixth mutation run, docs/results/mutation/run6_mutH/):
test_awq.py checks that AWQ beats RTN and that folding keeps the float function, which holds for
ANY scale; here each searched scale is checked to be the grid search's best on the right
activations: the attention input, the o_proj input (MHA), each expert's own routed tokens and its
SwiGLU activations, the dense FFN's input and down input; and the subsample above MAX_ROWS."""

from __future__ import annotations

import torch

import moe.quant.awq as awq
from moe.model import Transformer
from moe.quant import get_scheme
from moe.quant.awq import apply_awq, search_scale
from tests.conftest import tiny_model_config

SCHEME = get_scheme("int4", 16)


def _grid_best(w, x, n_grid):
    """AWQ's grid search written out: alpha = i / n_grid, s normalised by sqrt(max * min), first best."""
    w, x = w.float(), x.float()
    best, best_s = None, torch.ones(w.shape[1])
    for i in range(n_grid):
        s = x.abs().mean(0).pow(i / n_grid).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        err = float((x @ (SCHEME.fake_quantize(w * s) / s).T - x @ w.T).pow(2).mean())
        if best is None or err < best:
            best, best_s = err, s
    return best_s


def _outliers(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * 0.5
    x[:, [1, 5]] *= 40.0
    return x


def test_search_scale_is_the_grids_first_best_and_normalised():
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(24, 32, generator=g), _outliers(50, 32, 1)
    s = search_scale(w, x, SCHEME, n_grid=6)
    assert s.shape == (32,) and torch.equal(s, _grid_best(w, x, 6))
    assert abs(float(s.max() * s.min()) - 1.0) < 1e-5 and float(s[[1, 5]].min()) > 2 * float(s.median())
    assert float(s.min()) < 1.0 < float(s.max())  # not the all-ones alpha = 0
    assert torch.equal(search_scale(w, x, SCHEME), _grid_best(w, x, 20))  # the default grid: 20
    small = torch.rand(50, 32, generator=g) * 1e-6  # channel means below the clamp: clamped at 1e-4
    assert torch.equal(search_scale(w, small, SCHEME, n_grid=3), _grid_best(w, small, 3))


def test_search_scale_of_no_rows_is_ones():
    s = search_scale(torch.randn(5, 7), torch.zeros(0, 7), SCHEME)
    assert torch.equal(s, torch.ones(7))
    w, x1 = torch.randn(5, 32, generator=torch.Generator().manual_seed(6)), _outliers(1, 32, 7)
    one = search_scale(w, x1, SCHEME, n_grid=4)  # one row is searched like any other
    assert torch.equal(one, _grid_best(w, x1, 4)) and not torch.equal(one, torch.ones(32))


def test_above_max_rows_a_seeded_subsample_is_searched():
    g = torch.Generator().manual_seed(2)
    w, x = torch.randn(8, 16, generator=g), _outliers(40, 16, 3)
    x[::3] *= 0.01  # rows differ a lot: the subsample matters
    old = awq.MAX_ROWS
    try:
        awq.MAX_ROWS = 40
        at_limit = search_scale(w, x, SCHEME, n_grid=5)
        awq.MAX_ROWS = 17
        got = search_scale(w, x, SCHEME, n_grid=5)
    finally:
        awq.MAX_ROWS = old
    assert torch.equal(at_limit, _grid_best(w, x, 5))  # exactly MAX_ROWS rows: all, in order
    sub = x[torch.randperm(40, generator=torch.Generator().manual_seed(0))[:17]]
    assert torch.equal(got, _grid_best(w, sub, 5))


def _model():
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(n_layers=2, n_heads=4, n_kv_heads=4, qkv_bias=True, n_shared_experts=1,
                                          n_dense_layers=1)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _inputs(model, ids):
    """Each quantized layer's input rows and each MoE layer's routed experts, from the float model."""
    store, hooks = {}, []

    def keep(key):
        return lambda _m, args: store.setdefault(key, []).append(args[0].reshape(-1, args[0].shape[-1]).clone())

    for i, b in enumerate(model.layers):
        hooks.append(b.attn.qkv_proj.register_forward_pre_hook(keep(f"{i}.qkv")))
        hooks.append(b.attn.o_proj.register_forward_pre_hook(keep(f"{i}.o")))
        hooks.append(b.ffn.register_forward_pre_hook(keep(f"{i}.ffn")))
        dense = b.ffn if not b.is_moe else b.ffn.shared
        hooks.append(dense.down_proj.register_forward_pre_hook(keep(f"{i}.down")))
        if b.is_moe:
            hooks.append(b.ffn.router.register_forward_hook(
                lambda _m, _a, out, i=i: store.setdefault(f"{i}.route", []).append(out.experts_TK.clone())))
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    return {k: torch.cat(v) for k, v in store.items()}


def test_every_scale_is_searched_on_its_own_activations():
    model, n_grid = _model(), 3
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(4))
    acts = _inputs(model, ids)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        runtime = apply_awq(model, ids, SCHEME, n_grid=n_grid)
    after = model.state_dict()
    assert sorted(runtime) == ["layers.0.ffn.gate_proj", "layers.0.ffn.up_proj", "layers.1.ffn.experts",
                               "layers.1.ffn.shared.gate_proj", "layers.1.ffn.shared.up_proj"]
    close = dict(rtol=1e-5, atol=1e-6)
    for i in range(2):
        p = f"layers.{i}."
        s = _grid_best(before[p + "attn.qkv_proj.weight"], acts[f"{i}.qkv"], n_grid)
        torch.testing.assert_close(after[p + "attn_norm.weight"], before[p + "attn_norm.weight"] / s, **close)
        s_o = _grid_best(before[p + "attn.o_proj.weight"], acts[f"{i}.o"], n_grid)
        torch.testing.assert_close(after[p + "attn.o_proj.weight"], before[p + "attn.o_proj.weight"] * s_o, **close)
        v0 = 2 * 4 * model.layers[i].attn.head_dim
        torch.testing.assert_close(after[p + "attn.qkv_proj.weight"][v0:],
                                   before[p + "attn.qkv_proj.weight"][v0:] * s / s_o[:, None], **close)
        torch.testing.assert_close(after[p + "attn.qkv_proj.bias"][v0:], before[p + "attn.qkv_proj.bias"][v0:] / s_o,
                                   **close)
        torch.testing.assert_close(after[p + "attn.qkv_proj.weight"][:v0], before[p + "attn.qkv_proj.weight"][:v0] * s,
                                   **close)
        dense = p + ("ffn." if i == 0 else "ffn.shared.")
        w = torch.cat([before[dense + "gate_proj.weight"], before[dense + "up_proj.weight"]])
        s_in = _grid_best(w, acts[f"{i}.ffn"], n_grid)
        s_down = _grid_best(before[dense + "down_proj.weight"], acts[f"{i}.down"], n_grid)
        torch.testing.assert_close(runtime[dense + "gate_proj"], 1.0 / s_in, **close)
        assert runtime[dense + "up_proj"] is runtime[dense + "gate_proj"] or \
            torch.equal(runtime[dense + "up_proj"], runtime[dense + "gate_proj"])
        torch.testing.assert_close(after[dense + "gate_proj.weight"], before[dense + "gate_proj.weight"] * s_in, **close)
        torch.testing.assert_close(after[dense + "up_proj.weight"],
                                   before[dense + "up_proj.weight"] * s_in / s_down[:, None], **close)
        torch.testing.assert_close(after[dense + "down_proj.weight"], before[dense + "down_proj.weight"] * s_down,
                                   **close)
    # the experts of layer 1: each on the tokens routed to it
    gu, dn = before["layers.1.ffn.experts.gate_up_proj"], before["layers.1.ffn.experts.down_proj"]
    H = model.layers[1].ffn.experts.hidden
    x, route = acts["1.ffn"], acts["1.route"]
    scales = runtime["layers.1.ffn.experts"]
    assert scales.shape == (gu.shape[0], x.shape[1])
    searched = 0
    for e in range(gu.shape[0]):
        x_e = x[(route == e).any(-1)]
        s = _grid_best(gu[e], x_e, n_grid) if len(x_e) else torch.ones(x.shape[1])
        gate, up = (x_e @ gu[e].T).chunk(2, dim=-1)
        s_down = _grid_best(dn[e], torch.nn.functional.silu(gate) * up, n_grid) if len(x_e) else torch.ones(H)
        torch.testing.assert_close(scales[e], 1.0 / s, **close)
        torch.testing.assert_close(after["layers.1.ffn.experts.gate_up_proj"][e, :H], gu[e, :H] * s, **close)
        torch.testing.assert_close(after["layers.1.ffn.experts.gate_up_proj"][e, H:],
                                   gu[e, H:] * s / s_down[:, None], **close)
        torch.testing.assert_close(after["layers.1.ffn.experts.down_proj"][e], dn[e] * s_down, **close)
        searched += int(len(x_e) > 0 and (s - 1).abs().max() > 1e-3)
    assert searched >= 2  # the check is not between all-ones scales


def test_a_tie_keeps_the_first_grid_point_plain_rtn():
    """Every alpha gives the same error for a zero weight (all exact): the first best, alpha = 0, wins."""
    s = search_scale(torch.zeros(4, 32), _outliers(20, 32, 8), SCHEME, n_grid=5)
    assert torch.equal(s, torch.ones(32))


def test_in_a_bf16_model_both_sides_of_each_fold_use_the_scale_in_bf16():
    """The scale is cast to the weights' dtype before it is folded: the one bf16 value multiplies
    one side and divides the other (gate/up by s, up rows by s_down, down by s_down)."""
    model = _model().to(torch.bfloat16)
    g = torch.Generator().manual_seed(9)
    dense, moe = model.layers[0].ffn, model.layers[1].ffn
    D, H = dense.gate_proj.weight.shape[1], dense.down_proj.weight.shape[1]
    x, h = _outliers(30, D, 10), _outliers(30, H, 11)
    gate, up, down = (dense.gate_proj.weight.clone(), dense.up_proj.weight.clone(), dense.down_proj.weight.clone())
    s = search_scale(torch.cat([gate, up]), x, SCHEME, 3).to(torch.bfloat16)
    s_down = search_scale(down, h, SCHEME, 3).to(torch.bfloat16)
    with torch.no_grad():
        awq._dense_ffn("d", dense, x, h, SCHEME, 3)
    assert torch.equal(dense.gate_proj.weight, gate * s)
    assert torch.equal(dense.up_proj.weight, (up * s) / s_down[:, None])
    assert torch.equal(dense.down_proj.weight, down * s_down)
    ex = moe.experts
    gu, dn = ex.gate_up_proj.clone(), ex.down_proj.clone()
    route = torch.randint(0, ex.n_experts, (30, 2), generator=g)
    with torch.no_grad():
        awq._experts(ex, x, route, SCHEME, 3)
    Hx = ex.hidden
    for e in range(ex.n_experts):
        x_e = x[(route == e).any(-1)]
        s = search_scale(gu[e].float(), x_e, SCHEME, 3).to(torch.bfloat16)
        a, b = (x_e @ gu[e].float().T).chunk(2, dim=-1)
        s_down = search_scale(dn[e], torch.nn.functional.silu(a) * b, SCHEME, 3).to(torch.bfloat16)
        assert torch.equal(ex.gate_up_proj[e, :Hx], gu[e, :Hx] * s)
        assert torch.equal(ex.gate_up_proj[e, Hx:], (gu[e, Hx:] * s) / s_down[:, None])
        assert torch.equal(ex.down_proj[e], dn[e] * s_down)


def test_calibration_runs_in_batches_of_eight_sequences():
    """The capture forward holds at most 8 calibration sequences at a time (its memory bound)."""
    model, sizes = _model(), []
    hook = model.register_forward_pre_hook(lambda _m, args: sizes.append(args[0].shape[0]))
    try:
        acts = awq._capture(model, torch.randint(0, 97, (17, 4), generator=torch.Generator().manual_seed(1)))
    finally:
        hook.remove()
    assert sizes == [8, 8, 1] and acts["0.qkv"].shape[0] == 17 * 4
