"""Triton MoE grouped-GEMM kernels (kernels/moe_gemm.py) against their PyTorch references, and the
`triton` expert dispatch against the `loop` reference, forward and gradients.

Runs the kernels in the Triton interpreter (set below, before triton is imported; an explicit
TRITON_INTERPRET=0 in the environment is respected, e.g. to test the compiled kernels on a GPU).
Odd sizes throughout: token counts that are not a multiple of the row block, experts with no
tokens, dropped assignments (expert id == n_experts), top_k 1..4, D/H not multiples of 16, and
16-wide tiles so every loop runs over several tiles.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from kernels import moe_gemm as mg  # noqa: E402
from moe.config import ConfigError  # noqa: E402
from moe.experts import EXPERT_DISPATCH, SwiGLUExperts  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() and not mg._interpreting() else "cpu"
SMALL = dict(BLOCK_N=16, BLOCK_K=16)  # several tiles per loop at the test sizes
SMALL_W = dict(BLOCK_I=16, BLOCK_J=16, BLOCK_K=16)


def _routing_case(T, E, K, drop=True, empty_expert=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(T, E, generator=g)
    if empty_expert and E > K:
        scores[:, 0] = -1e9  # expert 0 gets no tokens
    experts = scores.topk(K, dim=-1).indices
    weights = torch.rand(T, K, generator=g)
    if drop:
        mask = torch.rand(T, K, generator=g) < 0.3
        experts = experts.masked_fill(mask, E)
        weights = weights.masked_fill(mask, 0.0)
    return experts.to(DEVICE), weights.to(DEVICE)


def _rand(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape) * scale).to(DEVICE, dtype)


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)


# ------------------------------------------------------------------------------------ routing

@pytest.mark.parametrize("T,E,K,block_m,exact", [(1, 2, 1, 16, True), (37, 5, 3, 16, False), (50, 6, 4, 32, True),
                                                 (0, 3, 2, 16, False), (40, 4, 2, 64, False)])
def test_routing_blocks_cover_each_group_exactly_once(T, E, K, block_m, exact):
    experts, _ = _routing_case(T, E, K)
    r = mg.moe_routing(experts, E, block_m, exact_blocks=exact)
    N = T * K
    flat = experts.reshape(-1).cpu()
    assert torch.equal(r.sorted_assign.cpu().sort().values, torch.arange(N, dtype=torch.int32))  # a permutation
    assert torch.equal(flat[r.sorted_assign.long().cpu()], r.sorted_expert.long().cpu())
    assert bool((r.sorted_expert[1:] >= r.sorted_expert[:-1]).all())
    assert torch.equal(r.sorted_token.cpu(), r.sorted_assign.cpu() // K)
    offs = r.group_offs.tolist()
    assert offs[0] == 0 and offs[-1] == N and len(offs) == E + 2
    seen = torch.zeros(N, dtype=torch.int64)
    for g, s in zip(r.block_group.tolist(), r.block_start.tolist()):
        if g < 0:
            continue
        assert offs[g] <= s < offs[g + 1], "a block starts outside its group"
        seen[s:min(s + block_m, offs[g + 1])] += 1
    assert bool((seen == 1).all()), "every sorted position (dropped ones too) is in exactly one block"
    if not exact:
        assert r.max_blocks == -(-N // block_m) + E + 1


def test_routing_treats_any_out_of_range_id_as_dropped():
    experts = torch.tensor([[0, 3], [7, -1], [2, 1]], device=DEVICE)
    r = mg.moe_routing(experts, 3, 16)
    assert r.group_offs.tolist() == [0, 1, 2, 3, 6]
    assert r.sorted_expert.tolist() == [0, 1, 2, 3, 3, 3]


# ------------------------------------------------------------------------------ single kernels

@pytest.mark.parametrize("T,Din,Nout,E,K,dtype", [  # T, D_in, N_out, E, K
    (37, 20, 33, 5, 3, torch.float32), (50, 7, 9, 4, 4, torch.float32), (13, 16, 24, 3, 1, torch.float32),
    (37, 20, 33, 5, 3, torch.bfloat16)])
def test_grouped_gemm_matches_reference(T, Din, Nout, E, K, dtype):
    experts, weights = _routing_case(T, E, K)
    r = mg.moe_routing(experts, E, 16)
    N = T * K
    scale = weights.reshape(-1)[r.sorted_assign.long()].float().contiguous()
    for x_grouped, y_grouped, trans_w, with_scale in [(False, True, True, False), (True, False, True, True),
                                                      (True, False, False, False), (False, False, False, True)]:
        x = _rand(N if x_grouped else T, Din, dtype=dtype)
        w = _rand(E, Nout, Din, dtype=dtype) if trans_w else _rand(E, Din, Nout, dtype=dtype)
        s = scale if with_scale else None
        got = mg.grouped_gemm(x, w, r, x_grouped=x_grouped, y_grouped=y_grouped, trans_w=trans_w, scale=s, tiles=SMALL)
        ref = mg.grouped_gemm_reference(x, w, r, x_grouped=x_grouped, y_grouped=y_grouped, trans_w=trans_w, scale=s)
        assert got.shape == (N, Nout) and got.dtype == dtype
        torch.testing.assert_close(got, ref, **_tol(dtype))
        dropped = (r.sorted_expert == E) if y_grouped else (experts.reshape(-1) == E)
        assert bool((got[dropped] == 0).all()), "dropped assignments' rows must be zero"


@pytest.mark.parametrize("T,D,H,E,K,dtype", [
    (37, 20, 17, 5, 3, torch.float32), (50, 7, 24, 4, 2, torch.float32), (37, 20, 17, 5, 3, torch.bfloat16),
    (50, 7, 24, 4, 2, torch.float16)])
def test_gate_up_swiglu_matches_reference(T, D, H, E, K, dtype):
    experts, _ = _routing_case(T, E, K)
    r = mg.moe_routing(experts, E, 16)
    x, gu_w = _rand(T, D, dtype=dtype), _rand(E, 2 * H, D, dtype=dtype, scale=D ** -0.5)
    h, gu = mg.gate_up_swiglu(x, gu_w, r, tiles=SMALL)
    h_ref, gu_ref = mg.gate_up_swiglu_reference(x, gu_w, r)
    torch.testing.assert_close(gu, gu_ref, **_tol(dtype))
    torch.testing.assert_close(h, h_ref, **_tol(dtype))
    h2, none = mg.gate_up_swiglu(x, gu_w, r, store_gate_up=False, tiles=SMALL)
    assert none is None and torch.equal(h2, h)


@pytest.mark.parametrize("T,D,H,E,K,dtype", [
    (37, 20, 17, 5, 3, torch.float32), (29, 33, 40, 3, 2, torch.float32), (37, 20, 17, 5, 3, torch.bfloat16)])
def test_swiglu_down_backward_matches_reference(T, D, H, E, K, dtype):
    experts, weights = _routing_case(T, E, K)
    r = mg.moe_routing(experts, E, 16)
    w_sorted = weights.reshape(-1)[r.sorted_assign.long()].float().contiguous()
    dy, down = _rand(T, D, dtype=dtype), _rand(E, D, H, dtype=dtype, scale=H ** -0.5)
    gu = mg.gate_up_swiglu_reference(_rand(T, D, dtype=dtype), _rand(E, 2 * H, D, dtype=dtype, scale=D ** -0.5), r)[1]
    dgu, h, dw = mg.swiglu_down_backward(dy, down, gu, w_sorted, r, tiles=SMALL)
    dgu_ref, h_ref, dw_ref = mg.swiglu_down_backward_reference(dy, down, gu, w_sorted, r)
    torch.testing.assert_close(h, h_ref, **_tol(dtype))
    torch.testing.assert_close(dgu, dgu_ref, **_tol(dtype))
    torch.testing.assert_close(dw, dw_ref, **(dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else _tol(dtype)))
    assert bool((dw[r.sorted_expert == E] == 0).all())


@pytest.mark.parametrize("T,Ma,Nb,E,K,dtype", [
    (37, 20, 33, 5, 3, torch.float32), (50, 9, 7, 6, 4, torch.float32), (50, 9, 7, 6, 4, torch.bfloat16)])
def test_group_weight_grad_matches_reference(T, Ma, Nb, E, K, dtype):
    experts, weights = _routing_case(T, E, K)
    r = mg.moe_routing(experts, E, 16)
    N = T * K
    scale = weights.reshape(-1)[r.sorted_assign.long()].float().contiguous()
    for a_grouped, b_grouped, with_scale in [(True, False, False), (False, True, True), (True, True, True)]:
        a = _rand(N if a_grouped else T, Ma, dtype=dtype)
        b = _rand(N if b_grouped else T, Nb, dtype=dtype)
        s = scale if with_scale else None
        got = mg.group_weight_grad(a, b, r, a_grouped=a_grouped, b_grouped=b_grouped, scale=s, tiles=SMALL_W)
        ref = mg.group_weight_grad_reference(a, b, r, a_grouped=a_grouped, b_grouped=b_grouped, scale=s)
        assert got.shape == (E, Ma, Nb)
        tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-1, rtol=3e-2)
        torch.testing.assert_close(got, ref, **tol)
        assert bool((got[0] == 0).all()), "an expert without tokens gets a zero gradient"


def test_kernels_with_upper_bound_block_map():
    """The CUDA-style map (no host sync: unused blocks marked -1) gives the same result."""
    experts, weights = _routing_case(45, 6, 3)
    x, w = _rand(45, 20), _rand(6, 24, 20)
    exact = mg.moe_routing(experts, 6, 16, exact_blocks=True)
    bound = mg.moe_routing(experts, 6, 16, exact_blocks=False)
    assert bound.max_blocks > exact.max_blocks
    a = mg.grouped_gemm(x, w, exact, x_grouped=False, y_grouped=False, tiles=SMALL)
    b = mg.grouped_gemm(x, w, bound, x_grouped=False, y_grouped=False, tiles=SMALL)
    assert torch.equal(a, b)


# --------------------------------------------------------------------- full MLP vs the loop

def _mlp_case(T, D, H, E, K, drop, dtype):
    experts, weights = _routing_case(T, E, K, drop=drop)
    x = _rand(T, D, dtype=dtype)
    gate_up = _rand(E, 2 * H, D, dtype=dtype, scale=D ** -0.5)
    down = _rand(E, D, H, dtype=dtype, scale=H ** -0.5)
    return x, experts, weights, gate_up, down


def _fwd_bwd(fn, inputs, gy=None):
    leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    y = fn(*leaves)
    if gy is None:
        gy = torch.randn_like(y)
    y.backward(gy)
    return y, gy, [leaves[i].grad for i in (0, 2, 3, 4)]


def _upcast(inputs):
    return [t.float() if t.is_floating_point() else t for t in inputs]


MLP_CASES = [  # T, D, H, E, K, drop, block_m (16: 16-wide tiles everywhere; None: the default config)
    (1, 8, 4, 2, 1, False, 16), (23, 20, 17, 5, 1, True, None), (37, 16, 24, 8, 3, True, 16),
    (50, 7, 5, 6, 4, True, None), (29, 33, 17, 3, 2, False, 16), (45, 24, 40, 4, 2, True, None),
]


@pytest.mark.parametrize("T,D,H,E,K,drop,block_m", MLP_CASES)
def test_moe_mlp_fp32_equals_loop_forward_and_grads(T, D, H, E, K, drop, block_m):
    inputs = _mlp_case(T, D, H, E, K, drop, torch.float32)
    tiles = SMALL if block_m == 16 else None
    y, gy, grads = _fwd_bwd(lambda *a: mg.moe_mlp(*a, block_m=block_m, tiles=tiles), inputs)
    y_ref, _, grads_ref = _fwd_bwd(EXPERT_DISPATCH.get("loop"), inputs, gy)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    for name, g, g_ref in zip(("x", "router weights", "gate_up", "down"), grads, grads_ref):
        torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4, msg=lambda m: f"d{name}: {m}")
    if drop:
        dropped = inputs[1] == E
        assert bool((grads[1][dropped] == 0).all()), "dropped slots get no router-weight gradient"


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)])
@pytest.mark.parametrize("T,D,H,E,K,drop", [(37, 16, 24, 8, 3, True), (50, 20, 17, 4, 2, False)])
def test_moe_mlp_low_precision_close_to_fp32_loop(T, D, H, E, K, drop, dtype):
    inputs = _mlp_case(T, D, H, E, K, drop, dtype)
    y, gy, grads = _fwd_bwd(lambda *a: mg.moe_mlp(*a, block_m=16), inputs)
    assert y.dtype == dtype and all(g.dtype == t.dtype for g, t in zip(grads, [inputs[i] for i in (0, 2, 3, 4)]))
    y_ref, _, grads_ref = _fwd_bwd(EXPERT_DISPATCH.get("loop"), _upcast(inputs), gy.float())
    torch.testing.assert_close(y.float(), y_ref, atol=3e-2, rtol=3e-2)
    for name, g, g_ref in zip(("x", "router weights", "gate_up", "down"), grads, grads_ref):
        err = (g.float() - g_ref).abs().max() / g_ref.abs().max().clamp_min(1e-6)
        assert err < 3e-2, f"d{name}: max error {err:.3g} of the largest entry"


@pytest.mark.slow
def test_moe_mlp_larger_fp32():
    inputs = _mlp_case(80, 40, 48, 12, 3, True, torch.float32)
    y, gy, grads = _fwd_bwd(lambda *a: mg.moe_mlp(*a, block_m=32, tiles=dict(BLOCK_N=32, BLOCK_K=32)), inputs)
    y_ref, _, grads_ref = _fwd_bwd(mg.moe_mlp_reference, inputs, gy)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4)


def test_moe_mlp_no_tokens():
    inputs = _mlp_case(0, 8, 4, 3, 2, False, torch.float32)
    y, _, grads = _fwd_bwd(mg.moe_mlp, inputs)
    assert y.shape == (0, 8) and grads[2].abs().sum() == 0


def test_moe_mlp_all_dropped():
    x, experts, weights, gate_up, down = _mlp_case(9, 8, 4, 3, 2, False, torch.float32)
    inputs = (x, torch.full_like(experts, 3), weights, gate_up, down)
    y, _, grads = _fwd_bwd(mg.moe_mlp, inputs)
    assert bool((y == 0).all()) and all(bool((g == 0).all()) for g in grads)


# ---------------------------------------------------------------------- the `triton` dispatch

def test_triton_dispatch_is_registered_and_matches_loop():
    inputs = _mlp_case(37, 16, 24, 8, 3, True, torch.float32)
    y, gy, grads = _fwd_bwd(EXPERT_DISPATCH.get("triton"), inputs)
    y_ref, _, grads_ref = _fwd_bwd(EXPERT_DISPATCH.get("loop"), inputs, gy)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4)


def test_swiglu_experts_module_with_triton_dispatch():
    E, D, H = 4, 12, 20
    mods = {}
    for name in ("triton", "loop"):
        torch.manual_seed(1)
        mods[name] = SwiGLUExperts(E, D, H, dispatch=name).to(DEVICE)
        torch.nn.init.normal_(mods[name].gate_up_proj, std=0.2)
        torch.nn.init.normal_(mods[name].down_proj, std=0.2)
    x = _rand(30, D)
    experts, weights = _routing_case(30, E, 2)
    out = {n: m(x, experts, weights) for n, m in mods.items()}
    torch.testing.assert_close(out["triton"], out["loop"], atol=1e-5, rtol=1e-5)
    for n in out:
        out[n].square().sum().backward()
    for p in ("gate_up_proj", "down_proj"):
        torch.testing.assert_close(getattr(mods["triton"], p).grad, getattr(mods["loop"], p).grad, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU autocast")
def test_triton_dispatch_bf16_autocast_close_to_fp32():
    x, e, w, gu, d = _mlp_case(40, 32, 32, 4, 2, False, torch.float32)
    gu.requires_grad_(True)
    y32 = EXPERT_DISPATCH.get("triton")(x, e, w, gu, d)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y16 = EXPERT_DISPATCH.get("triton")(x, e, w, gu, d)
    assert y16.dtype == torch.float32  # output keeps the residual stream's dtype
    torch.testing.assert_close(y16, y32, atol=5e-2, rtol=5e-2)
    y16.sum().backward()
    assert gu.grad.dtype == torch.float32 and torch.isfinite(gu.grad).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error path")
def test_cpu_without_interpreter_fails_with_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    inputs = _mlp_case(5, 8, 4, 2, 1, False, torch.float32)
    # Building a model looks the variant up with `get`, which refuses at start-up...
    with pytest.raises(ConfigError, match=r"experts.name='triton'.*TRITON_INTERPRET=1"):
        EXPERT_DISPATCH.get("triton")
    # ...and a direct call still fails clearly instead of launching.
    fn = EXPERT_DISPATCH.lookup("triton")
    with pytest.raises(RuntimeError, match=r"CUDA.*TRITON_INTERPRET=1"):
        fn(*inputs)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        mg.moe_mlp(*inputs)
    assert "TRITON_INTERPRET=1" in EXPERT_DISPATCH.unavailable_reason("triton")
    with pytest.raises(ConfigError, match="experts.name='triton'"):
        fn.check_available()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fn.unavailable_reason() is None
    fn.check_available()


# ---------------------------------------------------------------------------- input checks

def test_launchers_reject_bad_inputs_with_clear_errors():
    experts, weights = _routing_case(10, 3, 2)
    r = mg.moe_routing(experts, 3, 16)
    x, w = _rand(10, 8), _rand(3, 6, 8)
    with pytest.raises(ValueError, match=r"x must be \[10, \*\]"):
        mg.grouped_gemm(_rand(11, 8), w, r, x_grouped=False, y_grouped=True)
    with pytest.raises(ValueError, match="w expects 6"):
        mg.grouped_gemm(x, w, r, x_grouped=False, y_grouped=True, trans_w=False)
    with pytest.raises(ValueError, match="dtype torch.bfloat16 != activation dtype torch.float32"):
        mg.grouped_gemm(x, w.bfloat16(), r, x_grouped=False, y_grouped=True)
    with pytest.raises(ValueError, match="is not one of"):
        mg.grouped_gemm(x.double(), w.double(), r, x_grouped=False, y_grouped=True)
    with pytest.raises(ValueError, match="unit stride"):
        mg.grouped_gemm(_rand(8, 10).t(), w, r, x_grouped=False, y_grouped=True)
    with pytest.raises(ValueError, match="must be contiguous"):
        mg.grouped_gemm(x, _rand(3, 8, 6).transpose(1, 2), r, x_grouped=False, y_grouped=True)
    with pytest.raises(ValueError, match="n_experts=3"):
        mg.grouped_gemm(x, _rand(4, 6, 8), r, x_grouped=False, y_grouped=True)
    with pytest.raises(ValueError, match="fp32"):
        mg.grouped_gemm(x, w, r, x_grouped=False, y_grouped=True, scale=weights.reshape(-1).double())
    with pytest.raises(ValueError, match="is on meta but the routing on"):
        mg.grouped_gemm(torch.empty(10, 8, device="meta"), w, r, x_grouped=False, y_grouped=True)
    with pytest.raises(ValueError, match="power of two >= 16"):
        mg.grouped_gemm(x, w, r, x_grouped=False, y_grouped=True, tiles=dict(BLOCK_N=8, BLOCK_K=16))
    with pytest.raises(ValueError, match="power of two >= 16"):
        mg.moe_routing(experts, 3, block_m=24)
    with pytest.raises(ValueError, match="int32 or int64"):
        mg.moe_routing(experts.float(), 3)
    with pytest.raises(ValueError, match=r"gate_up \[E, 2H, D\] and down \[E, D, H\]"):
        mg.moe_mlp(x, experts, weights, _rand(3, 6, 8), _rand(3, 8, 4))
    with pytest.raises(ValueError, match="gu dtype"):
        mg.swiglu_down_backward(x, _rand(3, 8, 4), _rand(20, 8).bfloat16(), torch.zeros(20), r)
