"""The routing metadata every MoE kernel of one call shares: the (token, slot) assignments sorted
by expert and the row-block -> expert map (plain PyTorch, no host sync)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from kernels.moe_gemm.configs import CUDA_BLOCK_M, INTERPRET_BLOCK_M
from kernels.runtime import interpreting


@dataclass
class MoERouting:
    """The sorted assignment order and the row-block map shared by every kernel of one MoE call.

    `sorted_assign[p]` is the assignment `t * K + k` at sorted position `p` (grouped by expert,
    stable, dropped assignments last), `sorted_token[p] = sorted_assign[p] // K`,
    `sorted_expert[p]` its expert (`E` = dropped). Group `g` (expert `g`, or `E` = dropped) holds
    sorted positions `group_offs[g]:group_offs[g+1]`. Row block `b` covers positions
    `block_start[b] : min(block_start[b] + block_m, group_offs[block_group[b] + 1])` of group
    `block_group[b]`; `block_group[b] = -1` marks an unused block (the grid is sized by the upper
    bound `cdiv(N, block_m) + E + 1`, so building the map needs no host sync; CPU tensors get the
    exact count).
    """

    n_tokens: int
    top_k: int
    n_experts: int
    block_m: int
    sorted_expert: torch.Tensor  # int32 [N]
    sorted_assign: torch.Tensor  # int32 [N]
    sorted_token: torch.Tensor  # int32 [N]
    group_offs: torch.Tensor  # int32 [E + 2]
    block_group: torch.Tensor  # int32 [max_blocks]
    block_start: torch.Tensor  # int32 [max_blocks]

    @property
    def n_assign(self) -> int:
        return self.n_tokens * self.top_k

    @property
    def max_blocks(self) -> int:
        return self.block_group.numel()

    @property
    def device(self) -> torch.device:
        return self.sorted_assign.device


def moe_routing(experts_TK: torch.Tensor, n_experts: int, block_m: Optional[int] = None,
                exact_blocks: Optional[bool] = None) -> MoERouting:
    """Sort the (token, slot) assignments by expert and build the row-block -> expert map.

    Ids outside `[0, n_experts)` (the sentinel `n_experts`) are dropped assignments. Plain PyTorch,
    no host synchronisation: the block map is sized by an upper bound, unused blocks marked -1.
    `exact_blocks` (default: on CPU, where the sync is free) trims it to the used blocks instead.
    """
    if experts_TK.dim() != 2:
        raise ValueError(f"experts_TK must be [tokens, top_k]; got shape {tuple(experts_TK.shape)}")
    if experts_TK.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"experts_TK must be int32 or int64; got {experts_TK.dtype}")
    if n_experts < 1:
        raise ValueError(f"n_experts must be >= 1; got {n_experts}")
    if block_m is None:
        block_m = CUDA_BLOCK_M if experts_TK.device.type == "cuda" and not interpreting() else INTERPRET_BLOCK_M
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two >= 16 (tl.dot tiles); got {block_m}")
    T, K = experts_TK.shape
    N, E, dev = T * K, n_experts, experts_TK.device
    if N >= 2 ** 31:
        raise ValueError(f"{N} assignments do not fit the kernels' int32 row indices")
    flat = experts_TK.reshape(-1).long()
    flat = torch.where((flat >= 0) & (flat < E), flat, E)  # every invalid id is "dropped"
    sorted_expert, sorted_assign = torch.sort(flat, stable=True)
    # [E + 1] group sizes, the last one counting dropped assignments (scatter_add_, not bincount,
    # whose output size depends on the data and so costs a host sync on CUDA)
    counts = torch.zeros(E + 1, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    group_offs = torch.zeros(E + 2, dtype=torch.long, device=dev)
    group_offs[1:] = torch.cumsum(counts, 0)
    blocks = (counts + block_m - 1) // block_m
    block_end = torch.cumsum(blocks, 0)
    max_blocks = -(-N // block_m) + E + 1
    if exact_blocks if exact_blocks is not None else dev.type == "cpu":
        max_blocks = max(1, int(block_end[-1]))
    b = torch.arange(max_blocks, device=dev)
    g = torch.searchsorted(block_end, b, right=True)  # the group of block b; E + 1 = unused
    gc = g.clamp(max=E)
    block_start = group_offs[gc] + (b - (block_end[gc] - blocks[gc])) * block_m
    block_group = torch.where(g <= E, g, -1)
    i32 = torch.int32
    return MoERouting(T, K, E, block_m, sorted_expert.to(i32), sorted_assign.to(i32),
                      (sorted_assign // K).to(i32), group_offs.to(i32), block_group.to(i32),
                      torch.where(g <= E, block_start, 0).to(i32))
