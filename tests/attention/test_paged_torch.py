"""`moe/attention/paged_torch.py`: the `torch` paged backend's per-sequence SDPA prefill (the path
for prefills too large to pad) against the padded reference of `kernels/paged_attention`."""

import pytest
import torch

from kernels.paged_attention import paged_attention_prefill_torch
from moe.attention.paged_torch import paged_attention_prefill_sdpa
from tests.kernels.paged_attention.cases import DEVICE, TOL, make_cache, make_tables


@pytest.mark.parametrize("group,dtype", [(1, torch.float32), (4, torch.float32), (2, torch.bfloat16)])
def test_per_sequence_sdpa_prefill_matches_reference(group, dtype):
    G, d, bs = 2, 64, 16
    lens, q_lens = [1, 20, 33, 40], [1, 20, 3, 0]  # includes a sequence with no new query rows
    kc, vc = make_cache(24, bs, G, d, dtype)
    bt = make_tables(lens, bs, 24)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(q_lens), G * group, d, device=DEVICE).to(dtype)
    out = paged_attention_prefill_sdpa(q, kc, vc, bt, cu, cl, 0.125)
    ref = paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, 0.125)
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])
