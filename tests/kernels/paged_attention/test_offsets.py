"""The int64 row offsets of the paged-attention kernels (`_offset` in triton_kernels.py).

A token index times a packed-qkv row stride passes 2**31 elements at ~350k tokens per step
(6144-element rows). The kernels' every token / sequence / head row offset goes through the
`_offset` helper; this launches that same helper (bound the way the kernels get it, by
`LazyJit`) on indices whose products with real strides pass 2**31, and checks the results
against Python's exact integers. The plain int32 product is launched beside it as the control:
it does wrap, so the check would catch a helper that forgot the cast. (A real launch past 2**31
elements needs > 4 GB tensors: too big for a CPU test; test_launch.py checks the kernels' outputs
are unchanged on small shapes.)"""

import pytest
import torch

from kernels.paged_attention import triton_kernels as tk
from kernels.runtime import LazyJit, tl
from tests.kernels.paged_attention.cases import DEVICE, needs_triton

_offset = None  # bound by LazyJit, as in the kernels' module


def _offsets_kernel(I, OUT_WIDE, OUT_NARROW, stride):
    p = tl.program_id(0)
    i = tl.load(I + p)  # int32, like a program id, cu_seqlens or a head index
    tl.store(OUT_WIDE + p, _offset(i, stride))
    tl.store(OUT_NARROW + p, (i * stride).to(tl.int64))


offsets = LazyJit(_offsets_kernel, {"_offset": tk.HELPERS["_offset"]})


@needs_triton
@pytest.mark.parametrize("stride", [6144, 128 * 64, 2**20])
def test_offset_helper_is_exact_past_2_31(stride):
    idx = [0, 1, 349_000, 350_000, 2**31 // stride + 1, 2**31 - 1]
    i = torch.tensor(idx, dtype=torch.int32, device=DEVICE)
    wide, narrow = (torch.zeros(len(idx), dtype=torch.int64, device=DEVICE) for _ in range(2))
    offsets[(len(idx),)](i, wide, narrow, stride)
    exact = [v * stride for v in idx]
    assert wide.tolist() == exact
    assert max(exact) >= 2**31 and narrow.tolist() != exact  # the int32 product wraps: the control bites
    assert all(e < 2**31 for e, n in zip(exact, narrow.tolist()) if n == e)  # ...exactly where it passes 2**31
