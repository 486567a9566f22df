"""The `torch` paged backend's decode of gathered blocks (several sequences, or one whose blocks
are not consecutive): the reference's arithmetic (`paged_attention_decode_torch`, fp32 softmax)
without its allocations and copies.

Where the time went (issue 32, decode profile at batch 64: 7.2 of 9.5 ms of attention): the
gather allocated a fresh [S, L, G, d] tensor per layer for K and for V (megabytes at batch 64,
paid in page faults on every first touch), and the batched matmul then copied the permuted K
([S, G, d, L], a transpose with a G*d stride) and V once more. Here:

* the gathered blocks land in a `DecodeWorkspace`, scratch tensors kept by the backend and
  reused by every layer and step (no allocation, no page faults after the first step);
* one sequence on the CPU: fused attention over its gathered keys cut to its context (and
  window), no mask (its length is read on the host, as the contiguous path's);
* up to `SDPA_MAX_GATHERED` gathered elements (now: any size, see there) one fused
  `scaled_dot_product_attention` reads the strided [S, G, L, d] views directly, the
  context-length mask an additive bias; each kv head's R query heads are its R "queries";
* above it, K and V are copied once into workspace [S, G, L, d] tensors with contiguous rows, and
  two batched matmuls run on them (K read transposed by the BLAS call, not copied).

Both equal the reference to fp32 rounding (tests/attention/test_paged_torch_decode.py). Sliding
windows are part of the mask; attention sinks go to the reference (the backend decides).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from kernels.paged_attention import check_attention

# Gathered K elements (S * L * G * d) up to which the fused kernel is used: every size. It was 2^18 (above it
# the copy + matmuls), but in an interleaved A/B by CPU time (benchmarks/decode_attention_ab.py, torch 2.14.1,
# this model's G=4, d=32) the fused kernel on the strided views was the cheapest at every shape tried: batch 8
# to 128, contexts up to 2,000; 2.0x cheaper than the copy at batch 64 (docs/results/generate/perf_1204c).
# The copy branch stays for a lower bound (the tests send calls down both).
SDPA_MAX_GATHERED = 1 << 40


class DecodeWorkspace:
    """Scratch tensors by name, grown as needed and reused across layers and steps. A request
    above `max_elems` gets a fresh tensor (not kept: the workspace never holds more than a few
    such buffers of that size). Inference-mode tensors and ordinary ones are kept apart: an
    inference tensor cannot be written outside inference mode."""

    max_elems = 1 << 24

    def __init__(self):
        self._bufs: dict = {}

    def take(self, name: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        n = math.prod(shape)
        if n > self.max_elems:
            return torch.empty(shape, dtype=dtype, device=device)
        key = (name, dtype, device, torch.is_inference_mode_enabled())
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < n:
            # (doubling: a context grows a block at a time, a batch a sequence at a time)
            size = min(self.max_elems, max(n, 2 * (buf.numel() if buf is not None else 0)))
            buf = self._bufs[key] = torch.empty(size, dtype=dtype, device=device)
        return buf[:n].view(shape)


def allowed_keys(context_lens: torch.Tensor, L: int, window: Optional[int]) -> torch.Tensor:
    """[S, L] bool: the cached positions each decode query sees (before its context's end, and
    within the window: the query is the last token, at position context_len - 1)."""
    k_pos_1L = torch.arange(L, device=context_lens.device)[None, :]
    ctx_S1 = context_lens[:, None]
    valid_SL = k_pos_1L < ctx_S1
    if window is not None:
        valid_SL = valid_SL & (k_pos_1L > ctx_S1 - 1 - window)
    return valid_SL


class DecodePlan:
    """What the gathered decode works out from a step's tables once, for every layer (the tables
    and context lengths are the same in each): the flat block index of the gather, the host copy
    of the context lengths, and the additive context/window mask of each window met (built at the
    first layer with that window). Built per call, they were a third of the call at batch 8
    (`python -m benchmarks.step_ops_ab`: docs/results/generate/plan_1205). The host copy only for
    one sequence on the CPU (the path that reads it; elsewhere it would be a device sync)."""

    def __init__(self, block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int, span=None):
        self.span = span  # the backend's: (first slot, context length) of one sequence in consecutive blocks
        self.flat = block_tables.reshape(-1).long()
        self.context_lens = context_lens
        one_on_cpu = block_tables.shape[0] == 1 and context_lens.device.type == "cpu"
        self.host_context_lens = context_lens.tolist() if one_on_cpu else None
        self.L = block_tables.shape[1] * block_size
        self._bias: dict = {}

    def bias(self, window: Optional[int]) -> torch.Tensor:
        """[S, 1, 1, L] fp32: 0 where the query sees the key, -inf elsewhere."""
        bias = self._bias.get(window)
        if bias is None:
            valid_SL = allowed_keys(self.context_lens, self.L, window)
            bias = torch.zeros(valid_SL.shape[0], 1, 1, self.L, device=valid_SL.device)
            self._bias[window] = bias = bias.masked_fill_(~valid_SL[:, None, None, :], float("-inf"))
        return bias


def decode_gathered(q, k_cache, v_cache, block_tables, context_lens, scale: float, workspace: DecodeWorkspace,
                    window: Optional[int] = None, plan: Optional[DecodePlan] = None) -> torch.Tensor:
    """`paged_attention_decode_torch` without sinks: q [S, H, d] -> [S, H, d] in q's dtype.
    `plan`: a `DecodePlan` of these very tables (None: made here, for this call only)."""
    check_attention(q, k_cache, v_cache, block_tables, context_lens, "paged_attention_decode")
    S, H, d = q.shape
    _, bs, G, _ = k_cache.shape
    W = block_tables.shape[1]
    L, R = W * bs, H // G
    if S == 0:
        return q.new_empty(0, H, d)
    if plan is None:
        plan = DecodePlan(block_tables, context_lens, bs)
    gathered = (S * W, bs, G, d)
    k_SLGd = torch.index_select(k_cache, 0, plan.flat, out=workspace.take("k", gathered, k_cache.dtype, q.device))
    v_SLGd = torch.index_select(v_cache, 0, plan.flat, out=workspace.take("v", gathered, v_cache.dtype, q.device))
    k_SLGd, v_SLGd = k_SLGd.view(S, L, G, d), v_SLGd.view(S, L, G, d)
    q_SGRd = q.reshape(S, G, R, d).float()
    if S == 1 and q.device.type == "cpu":  # its keys cut to its context and window: no mask (a host read)
        ctx = plan.host_context_lens[0]
        lo = 0 if window is None else max(0, ctx - window)
        out_SGRd = F.scaled_dot_product_attention(q_SGRd, k_SLGd[:, lo:ctx].transpose(1, 2).float(),
                                                  v_SLGd[:, lo:ctx].transpose(1, 2).float(), scale=scale)
        return out_SGRd.reshape(S, H, d).to(q.dtype)
    if S * L * G * d <= SDPA_MAX_GATHERED:
        out_SGRd = F.scaled_dot_product_attention(q_SGRd, k_SLGd.transpose(1, 2).float(),
                                                  v_SLGd.transpose(1, 2).float(), attn_mask=plan.bias(window),
                                                  scale=scale)
    else:
        valid_SL = allowed_keys(context_lens, L, window)
        k_SGLd = workspace.take("kt", (S, G, L, d), torch.float32, q.device).copy_(k_SLGd.transpose(1, 2))
        v_SGLd = workspace.take("vt", (S, G, L, d), torch.float32, q.device).copy_(v_SLGd.transpose(1, 2))
        scores_SGRL = torch.matmul(q_SGRd, k_SGLd.transpose(-1, -2)).mul_(scale)
        scores_SGRL.masked_fill_(~valid_SL[:, None, None, :], float("-inf"))
        out_SGRd = torch.matmul(torch.softmax(scores_SGRL, dim=-1), v_SGLd)
    return out_SGRd.reshape(S, H, d).to(q.dtype)
