"""`moe/attention/paged_torch.py`: the `torch` paged backend's per-sequence SDPA prefill (the path
for prefills too large to pad) against the padded reference of `kernels/paged_attention`."""

import pytest
import torch

from kernels.paged_attention import paged_attention_prefill_torch
from moe.attention.paged_torch import paged_attention_prefill_sdpa
from tests.kernels.paged_attention.cases import DEVICE, TOL, make_cache, make_tables


# q_lens include a sequence with no new query rows, last and in the middle (the sequences after
# it must still be computed: rules out stopping at the first empty one)
@pytest.mark.parametrize("group,dtype,q_lens", [(1, torch.float32, [1, 20, 3, 0]), (4, torch.float32, [1, 20, 3, 0]),
                                                (2, torch.bfloat16, [1, 20, 3, 0]), (2, torch.float32, [1, 0, 3, 17])])
def test_per_sequence_sdpa_prefill_matches_reference(group, dtype, q_lens):
    G, d, bs = 2, 64, 16
    lens = [1, 20, 33, 40]
    kc, vc = make_cache(24, bs, G, d, dtype)
    bt = make_tables(lens, bs, 24)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(q_lens), G * group, d, device=DEVICE).to(dtype)
    out = paged_attention_prefill_sdpa(q, kc, vc, bt, cu, cl, 0.125)
    ref = paged_attention_prefill_torch(q, kc, vc, bt, cu, cl, 0.125)
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])


def test_bad_arguments_name_the_prefill():
    kc, vc = make_cache(4, 16, 2, 64, torch.float32)
    bt = make_tables([5], 16, 4)
    cl = torch.tensor([5], dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"^paged_attention_prefill: q must be \[tokens, n_heads, head_dim\]"):
        paged_attention_prefill_sdpa(torch.randn(5, 64, device=DEVICE), kc, vc, bt, cu, cl, 0.125)
