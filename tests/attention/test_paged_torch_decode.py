"""`moe/attention/paged_torch_decode.py`: the torch backend's gathered decode (workspace gather,
then fused SDPA or copy + matmuls) against the reference `paged_attention_decode_torch`, at odd
shapes, through both branches, with windows, and across calls that reuse (and grow, and shrink)
the workspace."""

import pytest
import torch

import moe.attention.paged_torch_decode as ptd
from kernels.paged_attention import paged_attention_decode_torch
from moe.attention.paged_torch import TorchPagedAttention
from tests.kernels.paged_attention.cases import TOL, make_cache, make_tables

BRANCHES = {"sdpa": 1 << 40, "matmul": -1}  # SDPA_MAX_GATHERED that sends every call down one branch


def _case(lens, bs, G, R, d, dtype, seed=0, nb=None):
    kc, vc = make_cache(nb or sum(-(-c // bs) for c in lens) + 4, bs, G, d, dtype, seed=seed)
    bt = make_tables(lens, bs, kc.shape[0], seed=seed).cpu()
    cl = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), G * R, d, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    return q, kc.cpu(), vc.cpu(), bt, cl


@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("lens,bs,G,R,d", [
    ([1, 70], 16, 2, 4, 32),  # contexts 1 and long, GQA 4
    ([1, 5, 3], 1, 2, 1, 8),  # block size 1, no GQA
    ([33, 1, 16, 17], 16, 1, 8, 16),  # one kv head for 8 query heads; a context at a block's end
    ([7], 4, 4, 2, 24),  # one sequence (non-consecutive blocks take this path at batch 1)
])
def test_gathered_decode_matches_the_reference(monkeypatch, branch, lens, bs, G, R, d):
    monkeypatch.setattr(ptd, "SDPA_MAX_GATHERED", BRANCHES[branch])
    q, kc, vc, bt, cl = _case(lens, bs, G, R, d, torch.float32)
    ws = ptd.DecodeWorkspace()
    got = ptd.decode_gathered(q, kc, vc, bt, cl, 0.3, ws)
    torch.testing.assert_close(got, paged_attention_decode_torch(q, kc, vc, bt, cl, 0.3), **TOL[torch.float32])


@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("window", [1, 5, 40])
def test_gathered_decode_with_a_window(monkeypatch, branch, window):
    """A window narrower than some contexts and wider than others (window 1: only the query's own key)."""
    monkeypatch.setattr(ptd, "SDPA_MAX_GATHERED", BRANCHES[branch])
    q, kc, vc, bt, cl = _case([1, 9, 40, 70], 16, 2, 2, 32, torch.float32, seed=3)
    got = ptd.decode_gathered(q, kc, vc, bt, cl, 0.2, ptd.DecodeWorkspace(), window)
    torch.testing.assert_close(got, paged_attention_decode_torch(q, kc, vc, bt, cl, 0.2, window),
                               **TOL[torch.float32])


@pytest.mark.parametrize("window", [None, 1, 5, 29, 30, 40])
@pytest.mark.parametrize("ctx", [1, 16, 30])
def test_one_sequence_is_cut_to_its_context_and_window(window, ctx):
    """One sequence on the CPU: no mask, its gathered keys sliced (windows narrower than, equal
    to and wider than its context; a context ending inside, at the end of, its last block)."""
    q, kc, vc, bt, cl = _case([ctx], 16, 2, 4, 32, torch.float32, seed=ctx)
    got = ptd.decode_gathered(q, kc, vc, bt, cl, 0.2, ptd.DecodeWorkspace(), window)
    torch.testing.assert_close(got, paged_attention_decode_torch(q, kc, vc, bt, cl, 0.2, window),
                               **TOL[torch.float32])


@pytest.mark.parametrize("branch", BRANCHES)
def test_bf16_cache_computes_in_fp32(monkeypatch, branch):
    monkeypatch.setattr(ptd, "SDPA_MAX_GATHERED", BRANCHES[branch])
    q, kc, vc, bt, cl = _case([3, 50, 18], 16, 2, 2, 32, torch.bfloat16, seed=5)
    got = ptd.decode_gathered(q, kc, vc, bt, cl, 0.2, ptd.DecodeWorkspace())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), paged_attention_decode_torch(q, kc, vc, bt, cl, 0.2).float(),
                               **TOL[torch.bfloat16])


def test_workspace_reuse_across_calls_of_other_shapes(monkeypatch):
    """One workspace through a large call, a small one, a larger one (it grows) and a small one
    again: every output is its own call's (no stale rows from an earlier, larger gather), and an
    output is not overwritten by the next call (it does not live in the workspace)."""
    monkeypatch.setattr(ptd, "SDPA_MAX_GATHERED", 2000)  # the calls below take both branches
    ws = ptd.DecodeWorkspace()
    cases = [_case([60, 2, 33], 16, 2, 2, 16, torch.float32, seed=7), _case([3], 16, 2, 2, 16, torch.float32, seed=8),
             _case([90, 80, 5, 64, 1], 16, 2, 2, 16, torch.float32, seed=9),
             _case([17, 2], 16, 2, 2, 16, torch.float32, seed=10)]
    outs = [ptd.decode_gathered(*c, 0.25, ws) for c in cases]
    for c, out in zip(cases, outs):
        torch.testing.assert_close(out, paged_attention_decode_torch(*c, 0.25), **TOL[torch.float32])


def test_workspace_keeps_buffers_and_refuses_to_hold_huge_ones(monkeypatch):
    ws = ptd.DecodeWorkspace()
    a = ws.take("k", (2, 3), torch.float32, torch.device("cpu"))
    b = ws.take("k", (3, 2), torch.float32, torch.device("cpu"))
    assert a.data_ptr() == b.data_ptr() and b.shape == (3, 2)  # reused, reshaped
    c = ws.take("k", (4, 4), torch.float32, torch.device("cpu"))
    assert c.shape == (4, 4) and ws.take("k", (1,), torch.float32, torch.device("cpu")).data_ptr() == c.data_ptr()
    assert ws.take("v", (1,), torch.float32, torch.device("cpu")).data_ptr() != c.data_ptr()  # by name
    assert ws.take("k", (1,), torch.bfloat16, torch.device("cpu")).dtype == torch.bfloat16  # by dtype
    monkeypatch.setattr(ptd.DecodeWorkspace, "max_elems", 10)
    big = ws.take("k", (11,), torch.float32, torch.device("cpu"))
    assert big.shape == (11,) and ws.take("k", (1,), torch.float32, torch.device("cpu")).data_ptr() == c.data_ptr()


def test_inference_mode_and_plain_calls_share_a_backend():
    """The engine decodes under inference mode; a workspace tensor made there cannot be written
    outside it, so the two get separate buffers and both orders work."""
    q, kc, vc, bt, cl = _case([5, 40], 16, 2, 2, 32, torch.float32, seed=11)
    ref = paged_attention_decode_torch(q, kc, vc, bt, cl, 0.2)
    backend = TorchPagedAttention()
    with torch.inference_mode():
        inside = backend.decode(q, kc, vc, bt, cl, 0.2)
    outside = backend.decode(q, kc, vc, bt, cl, 0.2)
    for out in (inside, outside):
        torch.testing.assert_close(out, ref, **TOL[torch.float32])


def test_backend_routes_decodes_by_their_options(monkeypatch):
    """Consecutive single sequence -> the contiguous view; several sequences or a window -> the
    gathered path; sinks -> the reference (the gathered path has no sink column). Each gives the
    reference's output."""
    used = []
    for name in ("decode_gathered", "decode_contiguous", "paged_attention_decode_torch"):
        real = getattr(__import__("moe.attention.paged_torch", fromlist=[name]), name)
        monkeypatch.setattr(f"moe.attention.paged_torch.{name}",
                            (lambda real, name: lambda *a: used.append(name) or real(*a))(real, name))
    kc, vc = make_cache(12, 16, 2, 32, torch.float32)
    kc, vc = kc.cpu(), vc.cpu()
    consecutive = torch.tensor([[3, 4, 5]], dtype=torch.int32)
    cl = torch.tensor([40], dtype=torch.int32)
    q = torch.randn(1, 4, 32)
    sinks = torch.randn(4)
    backend = TorchPagedAttention()
    for kwargs, path in (({}, "decode_contiguous"), ({"window": 8}, "decode_gathered"),
                         ({"sinks_H": sinks}, "paged_attention_decode_torch")):
        used.clear()
        out = backend.decode(q, kc, vc, consecutive, cl, 0.2, **kwargs)
        assert used[0] == path, (kwargs, used)
        torch.testing.assert_close(out, paged_attention_decode_torch(q, kc, vc, consecutive, cl, 0.2, **kwargs),
                                   **TOL[torch.float32])
    used.clear()
    two = torch.tensor([[3, 4, 5], [6, 0, 0]], dtype=torch.int32)
    backend.decode(torch.randn(2, 4, 32), kc, vc, two, torch.tensor([40, 3], dtype=torch.int32), 0.2)
    assert used[0] == "decode_gathered"


def test_no_sequences():
    q, kc, vc, bt, cl = _case([5], 16, 2, 2, 32, torch.float32)
    out = ptd.decode_gathered(q[:0], kc, vc, bt[:0], cl[:0], 0.2, ptd.DecodeWorkspace())
    assert out.shape == (0, 4, 32)


def test_bad_arguments_name_the_decode():
    q, kc, vc, bt, cl = _case([5], 16, 2, 2, 32, torch.float32)
    with pytest.raises(ValueError, match=r"^paged_attention_decode: block_tables must be a 2-D int32"):
        ptd.decode_gathered(q, kc, vc, bt.long(), cl, 0.2, ptd.DecodeWorkspace())


def test_a_large_batch_takes_the_fused_branch_by_default(monkeypatch):
    """The default bound sends a batch-64 decode (2^19 gathered elements, above the old 2^18 bound)
    to fused attention, not to the copy + matmuls (which `copy_` into the workspace's "kt")."""
    seen = []
    real = ptd.DecodeWorkspace.take
    monkeypatch.setattr(ptd.DecodeWorkspace, "take", lambda self, name, *a: seen.append(name) or real(self, name, *a))
    q, kc, vc, bt, cl = _case([64] * 64, 16, 4, 2, 32, torch.float32, seed=15)
    got = ptd.decode_gathered(q, kc, vc, bt, cl, 0.2, ptd.DecodeWorkspace())
    assert seen == ["k", "v"]
    torch.testing.assert_close(got, paged_attention_decode_torch(q, kc, vc, bt, cl, 0.2), **TOL[torch.float32])


@pytest.mark.parametrize("lens", [[1, 9, 40, 70], [23], [16, 16, 3]])
def test_a_step_plan_serves_every_layer_as_a_fresh_one(lens):
    """One `DecodePlan` shared by calls with different windows, in any order (its masks are made per
    window on first use) and through a workspace the calls share: each output bit for bit the
    output of a call that makes its own plan, and the reference's to rounding."""
    q, kc, vc, bt, cl = _case(lens, 16, 2, 2, 32, torch.float32, seed=len(lens))
    plan, ws = ptd.DecodePlan(bt, cl, 16), ptd.DecodeWorkspace()
    for window in (None, 8, None, 3, 8, 1, None):
        shared = ptd.decode_gathered(q, kc, vc, bt, cl, 0.2, ws, window, plan)
        alone = ptd.decode_gathered(q, kc, vc, bt, cl, 0.2, ptd.DecodeWorkspace(), window)
        assert torch.equal(shared, alone), window
        torch.testing.assert_close(shared, paged_attention_decode_torch(q, kc, vc, bt, cl, 0.2, window),
                                   **TOL[torch.float32])
    assert sorted(plan._bias, key=str) == ([1, 3, 8, None] if len(lens) > 1 else [])  # one mask per window


def test_backend_plan_takes_the_view_only_without_a_window():
    """The backend's plan of a single sequence in consecutive blocks carries its span; a windowed
    layer reading the same plan takes the gathered path (the view has no window), both exact."""
    kc, vc = make_cache(12, 16, 2, 32, torch.float32)
    kc, vc = kc.cpu(), vc.cpu()
    bt, cl = torch.tensor([[3, 4, 5]], dtype=torch.int32), torch.tensor([40], dtype=torch.int32)
    q = torch.randn(1, 4, 32)
    backend = TorchPagedAttention()
    plan = backend.plan_decode(bt, cl, 16)
    assert plan.span == (48, 40)
    scattered = backend.plan_decode(torch.tensor([[3, 5, 4]], dtype=torch.int32), cl, 16)
    assert scattered.span is None
    for window in (None, 8, 39, 40):
        torch.testing.assert_close(backend.decode(q, kc, vc, bt, cl, 0.2, window, plan=plan),
                                   paged_attention_decode_torch(q, kc, vc, bt, cl, 0.2, window), **TOL[torch.float32])
