"""`moe/attention/paged_torch.py`: tests from the re-run of the first mutation run's modules
(docs/results/mutation/rerun1b/): the compiled decode's matmul attention, reached by no test of the
first run's selection, and the backend's per-sequence prefill with a window and sinks."""

import pytest
import torch

from kernels.paged_attention import paged_attention_decode_torch, paged_attention_prefill_torch
import moe.attention.paged_torch as pt
from tests.kernels.paged_attention.cases import DEVICE, TOL, make_cache, make_tables


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 4])
def test_decode_matmul_matches_the_reference(dtype, group):
    """`paged_attention_decode_matmul` (the compiled decode step's attention) gives the gather
    reference's output: several sequences of different lengths (one token, inside a block, past
    several blocks) on random non-contiguous tables, grouped and plain heads, the given scale."""
    G, d, bs = 2, 16, 4
    lens = [1, 6, 13]
    kc, vc = make_cache(12, bs, G, d, dtype)
    bt = make_tables(lens, bs, 12)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = torch.randn(len(lens), G * group, d, device=DEVICE).to(dtype)
    out = pt.paged_attention_decode_matmul(q, kc, vc, bt, cl, 0.3)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), paged_attention_decode_torch(q, kc, vc, bt, cl, 0.3).float(), **TOL[dtype])
    with pytest.raises(ValueError, match="^paged_attention_decode"):  # its checks name the decode
        pt.paged_attention_decode_matmul(q[:, :, :-1], kc, vc, bt, cl, 0.3)


@pytest.mark.parametrize("window,with_sinks", [(3, False), (None, True), (3, True)])
@pytest.mark.parametrize("bound", [0, None])
def test_backend_prefill_keeps_window_and_sinks_on_both_paths(window, with_sinks, bound):
    """The backend's prefill passes the window and the sinks on, both to the padded reference
    (`bound` None: the class's default bound) and past `max_padded_scores` (0: every prefill one
    sequence at a time through SDPA): the reference's output, for a whole-prompt prefill (q_len ==
    context: the one case that could take SDPA's plain causal path) and a later chunk."""
    G, H, d, bs = 2, 4, 16, 4
    lens, q_lens = [9, 10], [9, 3]
    kc, vc = make_cache(12, bs, G, d, torch.float32)
    bt = make_tables(lens, bs, 12)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 9, 12], dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(12, H, d, generator=g).to(DEVICE)
    sinks = torch.randn(H, generator=g).to(DEVICE) if with_sinks else None
    backend = pt.TorchPagedAttention()
    if bound is not None:
        backend.max_padded_scores = bound
    out = backend.prefill(q, kc, vc, bt, cu, cl, 0.3, max(q_lens), window, sinks)
    ref = paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, 0.3, max(q_lens), window, sinks)
    plain = paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, 0.3, max(q_lens))
    torch.testing.assert_close(out, ref, **TOL[torch.float32])
    for rows in (slice(0, 9), slice(9, 12)):  # both sequences differ from plain causal attention
        assert not torch.allclose(ref[rows], plain[rows], atol=1e-3)


def test_per_sequence_prefill_builds_its_mask_on_the_queries_device(monkeypatch):
    """The window mask of the per-sequence SDPA prefill is asked for on q's device: a mask left on
    the CPU (device None) would fail SDPA beside CUDA queries, which a CPU-only run cannot show."""
    devices = []
    real = pt.allowed_mask
    monkeypatch.setattr(pt, "allowed_mask", lambda T, S, window, device: devices.append(device)
                        or real(T, S, window, device))
    G, H, d, bs = 1, 2, 8, 4
    kc, vc = make_cache(4, bs, G, d, torch.float32)
    bt = make_tables([6], bs, 4)
    cl = torch.tensor([6], dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
    q = torch.randn(2, H, d, device=DEVICE)
    out = pt.paged_attention_prefill_sdpa(q, kc, vc, bt, cu, cl, 0.3, 2)
    torch.testing.assert_close(out, paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, 0.3, 2, 2),
                               **TOL[torch.float32])
    assert devices == [q.device]


def test_decode_matmul_keeps_every_tensor_on_the_inputs_device():
    """The compiled decode's attention makes its tensors on the inputs' device: on the `meta`
    device (shapes only) it runs through, where a tensor made on the default CPU device (a dropped
    `device=`, which a CPU run cannot tell from the right one and a CUDA run would fail on) raises."""
    S, H, G, d, bs = 2, 4, 2, 8, 4
    kc = torch.empty(6, bs, G, d, device="meta")
    out = pt.paged_attention_decode_matmul(torch.empty(S, H, d, device="meta"), kc, torch.empty_like(kc),
                                           torch.zeros(S, 2, dtype=torch.int32, device="meta"),
                                           torch.zeros(S, dtype=torch.int32, device="meta"), 0.3)
    assert out.device.type == "meta" and out.shape == (S, H, d)


def test_per_sequence_prefill_of_fp32_queries_over_a_bf16_cache():
    """Queries in another dtype than the cache: both are taken to fp32 for SDPA (which wants one
    dtype; fp32 math, as the reference's) and the output comes back in the queries' dtype: the padded
    reference's output."""
    G, H, d, bs = 2, 4, 16, 4
    lens, q_lens = [7, 9], [7, 2]
    kc, vc = make_cache(8, bs, G, d, torch.bfloat16)
    bt = make_tables(lens, bs, 8)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 7, 9], dtype=torch.int32, device=DEVICE)
    q = torch.randn(9, H, d, device=DEVICE)
    out = pt.paged_attention_prefill_sdpa(q, kc, vc, bt, cu, cl, 0.3)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, 0.3), **TOL[torch.bfloat16])
