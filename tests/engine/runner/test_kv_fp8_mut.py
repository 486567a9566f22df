"""`FP8KVCache.compact` / `dequantized` (moe/engine/runner/kv_fp8.py) on the edges test_kv_fp8.py
leaves out, added for the mutation run of docs/results/mutation/run4_engine/: no tables, empty
tables, a single block, a latent (one-tensor) cache, the requested dtype, and every index tensor
on the cache's device (the meta device stands in for a GPU)."""

from __future__ import annotations

import torch

from moe.engine.runner.kv_fp8 import FP8KVCache

CPU = torch.device("cpu")


def _cache(n_tensors: int = 2, device=CPU) -> FP8KVCache:
    cache = FP8KVCache(1, 6, 2, 2, 4, device, n_tensors=n_tensors)
    if device == CPU:
        g = torch.Generator().manual_seed(0)
        k, v = torch.randn(12, 2, 4, generator=g) + 1, torch.randn(12, 2, 4, generator=g) - 1
        cache.write(0, k, None if n_tensors == 1 else v, torch.arange(12))
    return cache


def test_compact_without_blocks_is_one_zero_block():
    cache = FP8KVCache(1, 6, 2, 2, 4, CPU)  # nothing written: block 0 is zeros
    for tables in ([], [torch.zeros(0, 0, dtype=torch.int32)], [torch.zeros(2, 0, dtype=torch.int32)]):
        k_c, v_c, remapped = cache.compact(0, tables, torch.bfloat16)
        assert k_c.shape == v_c.shape == (1, 2, 2, 4) and k_c.dtype == v_c.dtype == torch.bfloat16
        assert [t.shape for t in remapped] == [t.shape for t in tables]


def test_compact_of_one_block_holds_that_block():
    cache = _cache()
    k_all, v_all = cache.dequantized(0)
    k_c, v_c, (t_c,) = cache.compact(0, [torch.tensor([[4]], dtype=torch.int32)], torch.float32)
    assert t_c.tolist() == [[0]] and t_c.dtype == torch.int32
    assert torch.equal(k_c[0], k_all[4]) and torch.equal(v_c[0], v_all[4])


def test_compact_and_dequantized_return_the_requested_dtype():
    cache = _cache()
    k_all, v_all = cache.dequantized(0, torch.bfloat16)
    assert k_all.dtype == v_all.dtype == torch.bfloat16
    k_c, v_c, _ = cache.compact(0, [torch.tensor([[1, 3]], dtype=torch.int32)], torch.float16)
    assert k_c.dtype == v_c.dtype == torch.float16
    torch.testing.assert_close(k_c.float(), cache.dequantized(0)[0][[1, 3]], atol=1e-2, rtol=1e-2)


def test_a_latent_cache_compacts_to_one_tensor_read_as_k_and_v():
    cache = _cache(n_tensors=1)
    k_c, v_c, (t_c,) = cache.compact(0, [torch.tensor([[5, 2]], dtype=torch.int32)], torch.float32)
    assert k_c is v_c and k_c.shape == (2, 2, 2, 4) and t_c.tolist() == [[1, 0]]
    k_all, v_all = cache.dequantized(0)
    assert torch.equal(k_all, v_all) and torch.equal(k_c, k_all[[2, 5]])


def _meta_unique(x_N: torch.Tensor) -> torch.Tensor:
    """`torch.unique` has no meta kernel; on meta only the device and dtype matter (no values)."""
    return torch.arange(min(x_N.numel(), 2), dtype=x_N.dtype, device=x_N.device)


def test_compact_keeps_every_tensor_on_the_cache_device():
    meta = torch.device("meta")
    cache = _cache(device=meta)
    real = torch.unique
    torch.unique = _meta_unique
    try:
        for tables in ([], [torch.zeros(1, 0, dtype=torch.int32, device=meta)],
                       [torch.tensor([[3, 1]], dtype=torch.int32, device=meta)]):
            k_c, v_c, remapped = cache.compact(0, tables, torch.float32)
            assert {x.device.type for x in (k_c, v_c, *remapped)} == {"meta"}
    finally:
        torch.unique = real
