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
