"""The paged-attention launchers (Triton): input checks, grids, tile sizes and the split count
around the kernels of `triton_kernels.py`. Each has a PyTorch reference in `reference.py`
(`*_torch`) that defines its semantics; the package docstring describes the three operations."""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from kernels import runtime
from kernels.paged_attention import triton_kernels as tk
from kernels.paged_attention.checks import check_attention, check_cu_seqlens, check_window_sinks, check_write
from kernels.runtime import check_launch, dot_flags, interpreting, pow2, triton

KERNELS = "the Triton paged-attention kernels"  # how the messages of runnable_reason name them
_LOG2E = 1.4426950408889634


def runnable_reason(device: Optional[torch.device] = None) -> Optional[str]:
    """None when the Triton paged-attention kernels can run on `device` (default: anywhere
    available), else why not."""
    return runtime.runnable_reason(device, KERNELS)


def _dot_flags(dtype: torch.dtype) -> dict:
    # fp32 caches use exact fp32 products (not TF32) so they match the reference closely
    return dot_flags(dtype, allow_tf32=False)


def reshape_and_cache(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Write `k, v: [N, G, d]` into `k_cache, v_cache` at `slot_mapping[N]` (Triton)."""
    check_write(k, v, k_cache, v_cache, slot_mapping)
    check_launch(KERNELS, k, v, k_cache, v_cache, slot_mapping)
    N = k.shape[0]
    if N == 0:
        return
    G, d, bs = k_cache.shape[2], k_cache.shape[3], k_cache.shape[1]
    tk.cache_write[(N,)](
        k, v, k_cache, v_cache, slot_mapping, *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(),
        N_KV_HEADS=G, HEAD_DIM=d, BLOCK_SIZE=bs, BLOCK_G=pow2(G), BLOCK_D=pow2(d))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def default_num_splits(num_seqs: int, n_kv_heads: int, max_context: int, device: torch.device) -> int:
    """Splits so that (seqs x kv heads x splits) programs cover the GPU about twice, with at
    least 256 tokens per split; 1 off CUDA (the interpreter gains nothing from splitting)."""
    if device.type != "cuda":
        return 1
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    want = math.ceil(2 * sms / max(num_seqs * n_kv_heads, 1))
    useful = max(1, math.ceil(max_context / 256))
    return pow2(min(want, useful, 64))


def split_buffers(rows: int, heads: int, width: int, num_splits: int, out: torch.Tensor):
    """The split-KV partials of a decode launch: fp32 `part [rows, heads, splits, width]` and
    `lse [rows, heads, splits]` with their strides when `num_splits > 1`; with one split the kernel
    writes `out` directly, and `out` stands in for both (never read; zero strides). Shared by this
    package's decode and the MLA decode (kernels/mla_decode), which reduce through `reduce_splits`."""
    if num_splits == 1:
        return out, out, (0, 0, 0, 0), (0, 0, 0)
    part = torch.empty(rows, heads, num_splits, width, dtype=torch.float32, device=out.device)
    lse = torch.empty(rows, heads, num_splits, dtype=torch.float32, device=out.device)
    return part, lse, part.stride(), lse.stride()


def reduce_splits(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, num_splits: int,
                  sinks: Optional[torch.Tensor] = None) -> None:
    """Merge `split_buffers`' partials into `out [rows, heads, width]` (log-sum-exp weighted; each
    head's sink logit `sinks [heads]`, if given, joins the denominator once); nothing to do with one split."""
    if num_splits == 1:
        return
    rows, heads, width = out.shape
    tk.decode_reduce[(rows, heads)](
        part, lse, out, out if sinks is None else sinks, num_splits, *part.stride(), *lse.stride(), *out.stride(),
        HEAD_DIM=width, BLOCK_D=pow2(width), BLOCK_K=pow2(num_splits), HAS_SINKS=sinks is not None)


def paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale: float,
                           num_splits: Optional[int] = None, out: Optional[torch.Tensor] = None,
                           window: Optional[int] = None, sinks_H: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Decode attention (Triton): q `[S, H, d]` -> `[S, H, d]`; every context_lens[s] must be >= 1.
    `window` and `sinks_H` as the reference's (`paged_attention_decode_torch`); with a window, the
    table entries before it are never read (they may be released blocks).

    `num_splits=None` picks a split count from the grid size (`default_num_splits`, bounded by
    `block_tables.shape[1] * block_size`, so no host sync is needed).
    """
    check_attention(q, k_cache, v_cache, block_tables, context_lens, "paged_attention_decode")
    check_window_sinks(q, window, sinks_H, "paged_attention_decode")
    check_launch(KERNELS, q, k_cache, v_cache, block_tables, context_lens)
    S, H, d = q.shape
    _, bs, G, _ = k_cache.shape
    out = torch.empty_like(q) if out is None else out
    if S == 0:
        return out
    if num_splits is None:
        num_splits = default_num_splits(S, G, block_tables.shape[1] * bs, q.device)
    if num_splits < 1:
        raise ValueError(f"paged_attention_decode: num_splits must be >= 1; got {num_splits}")
    group = H // G
    block_n = 64 if d <= 128 else 32  # a tile may span several blocks: each row finds its own block
    part, lse, part_strides, lse_strides = split_buffers(S, H, d, num_splits, out)
    tk.decode[(S, G, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part, lse, q if sinks_H is None else sinks_H,
        float(scale) * _LOG2E, num_splits, 0 if window is None else int(window),
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride(),
        *part_strides, *lse_strides,
        GROUP=group, BLOCK_R=pow2(group, 16), HEAD_DIM=d, BLOCK_D=pow2(d, 16), BLOCK_SIZE=bs, BLOCK_N=block_n,
        SPLIT=num_splits > 1, HAS_WINDOW=window is not None, HAS_SINKS=sinks_H is not None,
        **_dot_flags(k_cache.dtype))
    reduce_splits(part, lse, out, num_splits, sinks_H)
    return out


def paged_attention_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale: float,
                            max_seqlen_q: Optional[int] = None, out: Optional[torch.Tensor] = None,
                            window: Optional[int] = None, sinks_H: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Varlen prefill/extend attention (Triton): q `[N, H, d]` (rows of sequence s at
    `cu_seqlens_q[s]:cu_seqlens_q[s+1]`) -> `[N, H, d]`; see the package docstring. `window` and
    `sinks_H` as the reference's; table entries before a tile's window are never read."""
    check_attention(q, k_cache, v_cache, block_tables, context_lens, "paged_attention_prefill")
    check_window_sinks(q, window, sinks_H, "paged_attention_prefill")
    check_cu_seqlens(q, cu_seqlens_q, context_lens)
    check_launch(KERNELS, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
    N, H, d = q.shape
    S = context_lens.shape[0]
    _, bs, G, _ = k_cache.shape
    out = torch.empty_like(q) if out is None else out
    if N == 0 or S == 0:
        return out
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    interp = interpreting()
    # exact-fp32 dots hold more registers: 64-row tiles spill at head_dim 64 on sm_90 (compile_check)
    block_m = 16 if interp else 32 if q.dtype == torch.float32 else 64
    block_n = 16 if interp else (32 if q.dtype == torch.float32 else 64)
    grid = (S, H, triton.cdiv(max_seqlen_q, block_m))
    tk.prefill[grid](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out, q if sinks_H is None else sinks_H,
        float(scale) * _LOG2E, 0 if window is None else int(window),
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride(),
        GROUP=H // G, HEAD_DIM=d, BLOCK_D=pow2(d, 16), BLOCK_SIZE=bs, BLOCK_M=block_m, BLOCK_N=block_n,
        HAS_WINDOW=window is not None, HAS_SINKS=sinks_H is not None, **_dot_flags(k_cache.dtype))
    return out
