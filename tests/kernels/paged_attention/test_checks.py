"""`kernels/paged_attention/checks.py`: the references and the Triton launchers reject bad
inputs with errors naming the argument, before anything is launched."""

import pytest
import torch

from kernels.paged_attention import (paged_attention_decode, paged_attention_decode_torch,
                                     paged_attention_prefill_torch, reshape_and_cache_torch)
from kernels.runtime import triton
from tests.kernels.paged_attention.cases import DEVICE, make_cache

pytestmark = pytest.mark.usefixtures("one_thread")


def test_launchers_reject_bad_inputs():
    kc, vc = make_cache(4, 16, 2, 64, torch.float32)
    q = torch.randn(2, 4, 64, device=DEVICE)
    bt = torch.zeros(2, 2, dtype=torch.int32, device=DEVICE)
    cl = torch.tensor([3, 4], dtype=torch.int32, device=DEVICE)
    fns = [paged_attention_decode_torch] + ([paged_attention_decode] if triton is not None else [])
    for fn in fns:
        with pytest.raises(ValueError, match="int32"):
            fn(q, kc, vc, bt.long(), cl, 0.1)
        with pytest.raises(ValueError, match="head_dim"):
            fn(torch.randn(2, 4, 32, device=DEVICE), kc, vc, bt, cl, 0.1)
        with pytest.raises(ValueError, match="multiple"):
            fn(torch.randn(2, 3, 64, device=DEVICE), kc, vc, bt, cl, 0.1)
        with pytest.raises(ValueError, match="dtype"):
            fn(q, kc, vc.half(), bt, cl, 0.1)
        with pytest.raises(ValueError, match="2 sequences|sequences"):
            fn(q, kc, vc, bt, cl[:1], 0.1)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        paged_attention_prefill_torch(q, kc, vc, bt, torch.tensor([0, 2], dtype=torch.int32), cl, 0.1)
    with pytest.raises(ValueError, match=r"\[N, 2, 64\]"):
        reshape_and_cache_torch(torch.randn(3, 2, 32), torch.randn(3, 2, 32), kc, vc, torch.arange(3))
