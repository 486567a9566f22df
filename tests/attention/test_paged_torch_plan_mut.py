"""Added by the seventh mutation run (docs/results/mutation/run7_mutP/): the torch backend's per-step
`DecodePlan` and the decode paths that read it (21c6df3), each test written against mutants of
that change the first-pass tests let live: a plan handed in is the one used (no second plan a
call), its masks are made once per window, on the plan's own device, and a batch's plan reads
nothing on the host; the view path's argument errors name the decode."""

import pytest
import torch

import moe.attention.paged_torch_decode as ptd
from kernels.paged_attention import paged_attention_decode_torch
from moe.attention.paged_torch import TorchPagedAttention
from tests.kernels.paged_attention.cases import TOL, make_cache


def _cache():
    kc, vc = make_cache(12, 16, 2, 32, torch.float32)
    return kc.cpu(), vc.cpu()


def test_the_view_path_checks_its_arguments_as_the_decode():
    """A single sequence in consecutive blocks (the view path) with int64 tables: refused, and the
    message names the decode, as every other path's does."""
    kc, vc = _cache()
    bt, cl = torch.tensor([[3, 4, 5]]), torch.tensor([40], dtype=torch.int32)
    backend = TorchPagedAttention()
    assert backend.plan_decode(bt, cl, 16).span == (48, 40)  # the view path is the one taken
    with pytest.raises(ValueError, match=r"^paged_attention_decode: block_tables must be a 2-D int32"):
        backend.decode(torch.randn(1, 4, 32), kc, vc, bt, cl, 0.2)


def test_a_step_plan_is_made_once_for_all_layers(monkeypatch):
    """The backend's decode with the step's plan makes no plan of its own, at any layer (window or
    none): one `DecodePlan` a step, the plan_decode's; its masks are then those of the plan."""
    kc, vc = _cache()
    bt = torch.tensor([[3, 4, 5], [6, 0, 0]], dtype=torch.int32)
    cl = torch.tensor([40, 3], dtype=torch.int32)
    q = torch.randn(2, 4, 32, generator=torch.Generator().manual_seed(0))
    made = []
    real_init = ptd.DecodePlan.__init__
    monkeypatch.setattr(ptd.DecodePlan, "__init__", lambda self, *a, **k: made.append(self) or real_init(self, *a, **k))
    backend = TorchPagedAttention()
    plan = backend.plan_decode(bt, cl, 16)
    for window in (None, 8, None, 8):  # four "layers" of one step
        out = backend.decode(q, kc, vc, bt, cl, 0.2, window, plan=plan)
        torch.testing.assert_close(out, paged_attention_decode_torch(q, kc, vc, bt, cl, 0.2, window),
                                   **TOL[torch.float32])
    assert made == [plan]
    assert sorted(plan._bias, key=str) == [8, None]


def test_a_plan_builds_each_window_mask_once():
    """`bias(window)` is built at the first call for that window and the same tensor is returned
    after (the layers of a step share it); another window gets its own."""
    bt = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    plan = ptd.DecodePlan(bt, torch.tensor([3, 17, 32], dtype=torch.int32), 16)
    first = plan.bias(None)
    assert plan.bias(None) is first and plan.bias(4) is plan.bias(4) and plan.bias(4) is not first
    assert first.shape == (3, 1, 1, 32)
    assert torch.equal(torch.isinf(first[:, 0, 0]).sum(1), torch.tensor([29, 15, 0]))


def test_a_batch_plan_stays_on_its_device_and_reads_nothing_on_the_host():
    """A plan of several sequences, or of one, whose tables live off the CPU (meta here: shapes, no
    data) reads no context length on the host (on a GPU that would be a sync a step) and builds its
    masks on that device, not on the default one; on the CPU only a single sequence's plan reads them."""
    bt = torch.zeros(3, 4, dtype=torch.int32, device="meta")
    cl = torch.zeros(3, dtype=torch.int32, device="meta")
    plan = ptd.DecodePlan(bt, cl, 16)  # a host read of meta data raises
    assert plan.host_context_lens is None and plan.L == 64
    assert plan.flat.device.type == "meta" and plan.flat.dtype == torch.int64 and plan.flat.shape == (12,)
    for window in (None, 5):
        bias = plan.bias(window)
        assert bias.device.type == "meta" and bias.shape == (3, 1, 1, 64) and bias.dtype == torch.float32
    one = ptd.DecodePlan(bt[:1], cl[:1], 16)  # one sequence, but not on the CPU: no host read either
    assert one.host_context_lens is None
    cpu_batch = ptd.DecodePlan(torch.zeros(3, 4, dtype=torch.int32), torch.tensor([3, 9, 1], dtype=torch.int32), 16)
    assert cpu_batch.host_context_lens is None  # only the one-sequence CPU path reads it
    assert ptd.DecodePlan(torch.zeros(1, 4, dtype=torch.int32), torch.tensor([9], dtype=torch.int32), 16) \
        .host_context_lens == [9]


def _view_case(dtype_q, dtype_cache, ctx=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    kc, vc = torch.randn(8, 16, 2, 32, generator=g).to(dtype_cache), torch.randn(8, 16, 2, 32, generator=g).to(dtype_cache)
    q = torch.randn(1, 8, 32, generator=g).to(dtype_q)
    table = torch.arange(2, 2 + -(-ctx // 16), dtype=torch.int32)[None]
    return q, kc, vc, table, torch.tensor([ctx], dtype=torch.int32)


@pytest.mark.parametrize("dtype_q,dtype_cache", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)])
def test_the_view_path_computes_in_fp32_when_either_side_is_16_bit(dtype_q, dtype_cache):
    """A query and a cache of different dtypes (the checks allow it): both go to fp32, as the
    reference does, whichever of the two is the 16-bit one; the output in the query's dtype."""
    from moe.attention.paged_torch import decode_contiguous
    q, kc, vc, table, lens = _view_case(dtype_q, dtype_cache)
    out = decode_contiguous(q, kc, vc, 2 * 16, 37, 0.2)
    assert out.dtype == dtype_q
    torch.testing.assert_close(out.float(), paged_attention_decode_torch(q, kc, vc, table, lens, 0.2).float(),
                               **TOL[torch.bfloat16])


def test_the_view_path_with_one_cache_strided():
    """Only a contiguous cache is read through the one-call view: with K contiguous and V a strided
    view (or the other way round) each is read as it is laid out, the reference's output."""
    from moe.attention.paged_torch import decode_contiguous
    q, kc, vc, table, lens = _view_case(torch.float32, torch.float32, seed=4)
    wide = torch.randn(8, 16, 4, 32, generator=torch.Generator().manual_seed(5))
    strided = wide[:, :, ::2]  # [8, 16, 2, 32], not contiguous
    for k, v in ((kc, strided), (strided, vc)):
        assert k.is_contiguous() != v.is_contiguous()
        torch.testing.assert_close(decode_contiguous(q, k, v, 2 * 16, 37, 0.2),
                                   paged_attention_decode_torch(q, k, v, table, lens, 0.2), **TOL[torch.float32])


def test_the_view_path_is_one_fused_call_on_4d_views():
    """The view path is the fused call on [1, G, R, d] / [1, G, L, d] views, bit for bit (fp32)."""
    import torch.nn.functional as F
    from moe.attention.paged_torch import decode_contiguous
    q, kc, vc, _, _ = _view_case(torch.float32, torch.float32, ctx=70, seed=6)
    k = kc.view(-1, 2, 32)[32:102].transpose(0, 1).unsqueeze(0)
    v = vc.view(-1, 2, 32)[32:102].transpose(0, 1).unsqueeze(0)
    want = F.scaled_dot_product_attention(q.reshape(1, 2, 4, 32), k, v, scale=0.2).reshape(1, 8, 32)
    assert torch.equal(decode_contiguous(q, kc, vc, 2 * 16, 70, 0.2), want)


@pytest.mark.parametrize("bound", [1 << 40, -1])  # the fused branch, the copy + matmuls branch
@pytest.mark.parametrize("window", [None, 5])
def test_the_gathered_decode_runs_on_the_inputs_device(monkeypatch, window, bound):
    """The gathered decode of a batch whose tensors live off the CPU (meta here: shapes only) keeps
    everything on that device: its workspace buffers, the plan's index and masks, the output (a
    buffer on the default device would be a cross-device copy, refused)."""
    monkeypatch.setattr(ptd, "SDPA_MAX_GATHERED", bound)
    m = "meta"
    q, kc, vc = torch.empty(3, 4, 32, device=m), torch.empty(10, 16, 2, 32, device=m), torch.empty(10, 16, 2, 32, device=m)
    bt, cl = torch.zeros(3, 2, dtype=torch.int32, device=m), torch.zeros(3, dtype=torch.int32, device=m)
    ws = ptd.DecodeWorkspace()
    for plan in (None, ptd.DecodePlan(bt, cl, 16)):
        out = ptd.decode_gathered(q, kc, vc, bt, cl, 0.2, ws, window, plan)
        assert out.shape == (3, 4, 32) and out.device.type == m and out.dtype == torch.float32


def test_the_fused_branch_ends_exactly_at_its_bound(monkeypatch):
    """Up to SDPA_MAX_GATHERED gathered elements (S * L * G * d, here 3 * 32 * 2 * 8 = 1,536) the
    fused call; one element fewer allowed and the copy + matmuls (which take the "kt" and "vt"
    buffers). Factors chosen so that a division for any product moves the switch."""
    q, kc, vc = torch.randn(3, 4, 8), torch.randn(10, 16, 2, 8), torch.randn(10, 16, 2, 8)
    bt = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    cl = torch.tensor([20, 32, 7], dtype=torch.int32)
    ref = paged_attention_decode_torch(q, kc, vc, bt, cl, 0.3)
    seen = []
    real = ptd.DecodeWorkspace.take
    monkeypatch.setattr(ptd.DecodeWorkspace, "take", lambda self, name, *a: seen.append(name) or real(self, name, *a))
    for bound, names in ((3 * 32 * 2 * 8, ["k", "v"]), (3 * 32 * 2 * 8 - 1, ["k", "v", "kt", "vt"])):
        monkeypatch.setattr(ptd, "SDPA_MAX_GATHERED", bound)
        seen.clear()
        torch.testing.assert_close(ptd.decode_gathered(q, kc, vc, bt, cl, 0.3, ptd.DecodeWorkspace()), ref,
                                   **TOL[torch.float32])
        assert seen == names, (bound, seen)


def test_the_copy_branch_is_fp32_whatever_the_default_dtype(monkeypatch):
    """The copy + matmuls branch's transposed buffers are fp32 by name, not torch's default dtype:
    under a float64 default the output is still the reference's, in the query's dtype."""
    monkeypatch.setattr(ptd, "SDPA_MAX_GATHERED", -1)
    q, kc, vc = torch.randn(2, 4, 8), torch.randn(6, 16, 2, 8), torch.randn(6, 16, 2, 8)
    bt, cl = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), torch.tensor([20, 5], dtype=torch.int32)
    ref = paged_attention_decode_torch(q, kc, vc, bt, cl, 0.3)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = ptd.decode_gathered(q, kc, vc, bt, cl, 0.3, ptd.DecodeWorkspace())
    finally:
        torch.set_default_dtype(old)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, **TOL[torch.float32])
