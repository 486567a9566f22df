"""Peak activation memory of one engine-sized forward: measured on a GPU, or estimated on the
meta device (no weights, no memory) with shape-faithful stand-ins for the data-dependent parts.

The forward is the model's own at `num_tokens` tokens in one sequence, with the LM head applied
to `num_logit_rows` rows only (as the engine does: one row per sampled sequence). Without a
device, `estimate_peak_activations` runs it on meta tensors under `PeakMemory`, a dispatch mode
that adds up the bytes of every tensor the ops create while it is alive and keeps the peak
(parameters and inputs, made before, are not counted). Two parts cannot run on meta tensors and
are replaced, for the estimate only, by stand-ins that allocate what the real ones allocate:
the expert dispatch (its group sizes are data: the stand-in allocates the sorted dispatch's
[T*K, ...] buffers) and attention (a fused kernel's output; PyTorch's math fallback on meta would
materialise a [T, T] score matrix that flash / memory-efficient kernels never hold).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from moe.engine.memory.kv_groups import blocks_held
from moe.engine.runner.model_runner import only_rows

RESERVE_FRACTION = 0.05  # of the device: CUDA context, cuBLAS / NCCL workspaces, fragmentation
MIN_RESERVE = 2**30


class PeakMemory(TorchDispatchMode):
    """Bytes held by the tensors created under this mode (`current`) and their maximum (`peak`)."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, list[int]] = {}  # storage -> [bytes, live tensors viewing it]
        self.current = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.bincount.default and args[0].is_meta:  # no meta kernel (its size is data)
            n = max(kwargs.get("minlength", args[2] if len(args) > 2 else 0), 1)
            out = torch.empty(n, dtype=torch.long if args[1] is None else args[1].dtype, device="meta")
        else:
            out = func(*args, **kwargs)
        inputs = {t.untyped_storage()._cdata for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t, inputs)
        return out

    def _track(self, t: torch.Tensor, inputs: set) -> None:
        key = t.untyped_storage()._cdata
        entry = self.live.get(key)
        if entry is None:
            if key in inputs:  # a view of (or in place on) a tensor made outside: no new memory
                return
            entry = self.live[key] = [t.untyped_storage().nbytes(), 0]
            self.current += entry[0]
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[key]


def standin_dispatch(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH) -> torch.Tensor:
    """The sorted dispatch's allocations with static shapes (every row through expert 0's
    weights: the values are meaningless, the buffer sizes are the sorted dispatch's)."""
    T, K = experts_TK.shape
    order_N = torch.argsort(experts_TK.reshape(-1), stable=True)
    token_idx_N = order_N // K
    x_ND = x_TD.index_select(0, token_idx_N)
    gate_NH, up_NH = (x_ND @ gate_up_E2HD[0].transpose(0, 1)).chunk(2, dim=-1)
    h_NH = F.silu(gate_NH.contiguous()) * up_NH
    out_ND = (h_NH @ down_EDH[0].transpose(0, 1)) * weights_TK.reshape(-1).index_select(0, order_N).unsqueeze(-1)
    return torch.zeros_like(x_TD).index_add(0, token_idx_N, out_ND.to(x_TD.dtype))


def standin_attention(q_BHTd, k_BGTd, v_BGTd, causal: bool = True, window=None, sinks_H=None,
                     attn_mask=None) -> torch.Tensor:
    """A fused attention kernel's allocation: its output (and a [B, H, T] fp32 logsumexp). The
    output has v's width, which differs from q's under MLA (nope + rope vs v_head_dim)."""
    torch.empty(q_BHTd.shape[:3], dtype=torch.float32, device=q_BHTd.device)
    return q_BHTd.new_empty(*q_BHTd.shape[:3], v_BGTd.shape[-1])


def _standin_forward(experts, x_TD, experts_TK, weights_TK) -> torch.Tensor:
    return standin_dispatch(x_TD, experts_TK, weights_TK, experts.gate_up_proj, experts.down_proj)


@contextlib.contextmanager
def _standins(model):
    """Swap in the stand-ins and rotary tables indexed without the host check of `Rotary.forward`."""
    rot = model.rotary
    all_experts = [b.ffn.experts for b in model.layers if getattr(b, "is_moe", False)]
    experts = [e for e in all_experts if hasattr(e, "dispatch")]
    # experts with their own forward (BiasedExperts: GPT-OSS's biases and clamped SwiGLU) get the stand-in
    # as an instance `forward` (same buffers: the biases add nothing of [T*K, ...] size)
    own_forward = [e for e in all_experts if not hasattr(e, "dispatch")]
    attns = [b.attn for b in model.layers]
    saved = ([e.dispatch for e in experts], [a.backend for a in attns], rot.forward)
    for e in experts:
        e.dispatch = standin_dispatch
    for e in own_forward:
        e.forward = functools.partial(_standin_forward, e)
    for a in attns:
        a.backend = standin_attention
    rot.forward = lambda positions: (rot.cos[positions], rot.sin[positions])
    try:
        yield
    finally:
        for e in own_forward:
            del e.forward
        for e, d in zip(experts, saved[0]):
            e.dispatch = d
        for a, b in zip(attns, saved[1]):
            a.backend = b
        rot.forward = saved[2]


def _dummy_forward(model, num_tokens: int, num_logit_rows: int, device) -> None:
    ids = torch.zeros(1, num_tokens, dtype=torch.long, device=device)
    pos = (torch.arange(num_tokens, device=device) % model.cfg.max_seq_len).unsqueeze(0)  # trained positions only
    rows = torch.arange(num_tokens - min(num_logit_rows, num_tokens), num_tokens, device=device)
    with only_rows(model, rows):
        out = model(ids, positions=pos)
    return out.logits.float()  # the engine's fp32 logits rows


@torch.inference_mode()
def estimate_peak_activations(model, num_tokens: int, num_logit_rows: int) -> int:
    """Peak bytes of activations of the forward, on meta tensors (`model` is moved to meta:
    build it there, `with torch.device("meta")`, to plan without memory)."""
    model.to("meta")  # (the rotary tables follow, for the model's positions: the forward uses no others)
    with _standins(model), PeakMemory() as mem:
        _dummy_forward(model, num_tokens, num_logit_rows, "meta")
    return mem.peak


@torch.inference_mode()
def measure_peak_activations(model, num_tokens: int, num_logit_rows: int) -> int:
    """Peak bytes the forward allocates on `model`'s CUDA device, measured (all kernels real)."""
    device = next(model.parameters()).device
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    _dummy_forward(model, num_tokens, num_logit_rows, device)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    torch.cuda.empty_cache()
    return peak


def default_reserve(device_memory: int) -> int:
    return max(MIN_RESERVE, int(RESERVE_FRACTION * device_memory))


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


@dataclass
class MemoryPlan:
    device_memory: int  # the budget
    weights: int  # on a GPU: everything in use before the cache (weights, CUDA context, other processes)
    activations: int  # peak of one forward at max_num_batched_tokens
    reserve: int
    kv_bytes_per_block: int
    block_size: int
    max_num_batched_tokens: int
    max_model_len: int
    measured: bool = False  # activations measured on the device (else estimated on meta)
    sliding_window: Optional[int] = None  # every layer slides: the engine keeps a sequence's window only

    @property
    def blocks_per_sequence(self) -> int:
        """The most blocks one sequence of max_model_len tokens holds (moe.engine.memory.kv_groups)."""
        return blocks_held(self.max_model_len, self.block_size, self.sliding_window, self.max_num_batched_tokens)

    @property
    def kv_cache(self) -> int:
        return self.device_memory - self.weights - self.activations - self.reserve

    @property
    def num_blocks(self) -> int:
        return max(0, self.kv_cache // self.kv_bytes_per_block)

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def lines(self) -> list[str]:
        how = "measured" if self.measured else "an upper bound from the config"
        out = [f"device memory          {gib(self.device_memory)}",
               f"- weights              {gib(self.weights)}",
               f"- peak activations     {gib(self.activations)}  (one forward of {self.max_num_batched_tokens} "
               f"tokens, {how})",
               f"- reserve              {gib(self.reserve)}",
               f"= KV cache             {gib(self.kv_cache)}: {self.num_blocks} blocks of {self.block_size} tokens "
               f"({self.kv_bytes_per_block / self.block_size / 2**10:.0f} KiB a token) = {self.kv_tokens} tokens, "
               f"{self.num_blocks / self.blocks_per_sequence:.1f} sequences of {self.max_model_len}"]
        if self.sliding_window is not None:
            out.append(f"  (every layer slides over {self.sliding_window} tokens: a sequence holds at most "
                       f"{self.blocks_per_sequence} blocks, its window and one step's {self.max_num_batched_tokens} "
                       "tokens)")
        if self.num_blocks < self.blocks_per_sequence:
            out.append("DOES NOT FIT: the cache cannot hold one sequence of max_model_len tokens")
        return out
