"""`FP8KVCache` holds what `fp8_bytes_per_block` counts whatever torch's default dtype is: codes one
byte, scales fp32 (moe/engine/runner/kv_fp8.py). Added for the sixth mutation run
(docs/results/mutation/run6_mutX/README.md): the scales' `dtype=torch.float32` dropped survived every
test, which all run under the float32 default."""

from __future__ import annotations

import pytest
import torch

from moe.engine.runner.kv_fp8 import FP8KVCache, fp8_bytes_per_block


@pytest.mark.parametrize("n_tensors", [2, 1])  # K and V, or a latent (MLA) cache
def test_the_cache_holds_the_bytes_it_is_sized_for_under_any_default_dtype(n_tensors):
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        cache = FP8KVCache(2, 3, 4, 2, 8, torch.device("cpu"), n_tensors=n_tensors)
    finally:
        torch.set_default_dtype(before)
    assert cache.codes.dtype == torch.uint8 and cache.scales.dtype == torch.float32
    held = cache.codes.numel() * cache.codes.element_size() + cache.scales.numel() * cache.scales.element_size()
    assert held == 3 * fp8_bytes_per_block(2, 4, 2, 8, n_tensors=n_tensors)  # 3 blocks
    assert fp8_bytes_per_block(2, 4, 2, 8, n_tensors=n_tensors) == n_tensors * 2 * 4 * 2 * (8 + 4)
