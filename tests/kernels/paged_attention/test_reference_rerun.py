"""kernels/paged_attention/reference.py's decode keeps its tensors on the inputs' device, added by
the first mutation run's re-record (docs/results/mutation/rerun1b/README.md): the first run listed
`device` dropped or None as "identical on CPU". Run on the `meta` device, a position index made on
the CPU (a dropped `device=q.device`) cannot be combined with the meta inputs, so the CPU alone
tells the two apart; the output comes back in the queries' dtype (bf16 here; a dropped cast
returns the fp32 softmax product). (The prefill's last step, a boolean-mask gather, has no meta implementation.)"""

from __future__ import annotations

import pytest
import torch

from kernels.paged_attention.reference import paged_attention_decode_torch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 3])
def test_decode_reference_keeps_every_tensor_on_the_inputs_device(window, dtype):
    S, H, G, d, bs, nb = 2, 4, 2, 8, 4, 6
    meta = torch.device("meta")
    q = torch.empty(S, H, d, device=meta, dtype=dtype)
    kc = torch.empty(nb, bs, G, d, device=meta, dtype=dtype)
    vc = torch.empty(nb, bs, G, d, device=meta, dtype=dtype)
    bt = torch.empty(S, 3, dtype=torch.int32, device=meta)
    cl = torch.empty(S, dtype=torch.int32, device=meta)
    out = paged_attention_decode_torch(q, kc, vc, bt, cl, 0.5, window=window, sinks_H=torch.empty(H, device=meta))
    assert out.device.type == "meta" and out.shape == (S, H, d) and out.dtype == dtype


@pytest.mark.parametrize("window", [None, 2])
def test_prefill_reference_makes_its_positions_on_the_inputs_device(window):
    # The prefill has no meta implementation (its last step is a boolean-mask gather), so the inputs stay on
    # the CPU and the default device is `meta`: a position index made without `device=q.device` is a meta
    # tensor that cannot meet them. With it, the output is the one computed without the default device.
    from kernels.paged_attention.reference import paged_attention_prefill_torch
    g = torch.Generator().manual_seed(0)
    H, G, d, bs, nb = 4, 2, 8, 4, 6
    q = torch.randn(5, H, d, generator=g)
    kc, vc = torch.randn(nb, bs, G, d, generator=g), torch.randn(nb, bs, G, d, generator=g)
    bt = torch.tensor([[1, 3, 0], [2, 4, 5]], dtype=torch.int32)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    cl = torch.tensor([6, 9], dtype=torch.int32)
    want = paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, 0.5, window=window)
    with torch.device("meta"):
        got = paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, 0.5, window=window)
    assert got.device.type == "cpu" and torch.equal(got, want)
