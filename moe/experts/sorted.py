"""Fast dispatch: sort assignments by expert, one grouped matmul per projection, weighted
scatter-add back (the permute + grouped-GEMM scheme of MegaBlocks/torchtitan, dropless)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe.experts.base import EXPERT_DISPATCH
from moe.experts.grouped_mm import grouped_mm
from moe.profiling import stage


def sort_by_expert(experts_TK: torch.Tensor, n_experts: int):
    """Return (order_N, token_idx_N, offs_E): the assignment permutation grouped by expert
    (dropped assignments, id == n_experts, excluded), the token of each, and group ends."""
    flat = experts_TK.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts_E = torch.bincount(flat, minlength=n_experts + 1)
    offs_E = torch.cumsum(counts_E[:n_experts], 0).to(torch.int32)
    n_dropped = int(counts_E[n_experts])  # one host sync; lets the slices below have exact sizes
    if n_dropped:
        order = order[: flat.numel() - n_dropped]
    return order, order // experts_TK.shape[1], offs_E


@EXPERT_DISPATCH.register("sorted")
def sorted_dispatch(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH) -> torch.Tensor:
    """Stages: permute tokens into expert order -> grouped gate/up matmul -> SwiGLU ->
    grouped down matmul -> scale by router weight -> index_add back to token order."""
    E = gate_up_E2HD.shape[0]
    dtype = torch.get_autocast_dtype(x_TD.device.type) if torch.is_autocast_enabled(x_TD.device.type) else x_TD.dtype
    with stage("dispatch"):
        order_N, token_idx_N, offs_E = sort_by_expert(experts_TK, E)
        # grouped_mm is not autocast-aware: cast operands ourselves so bf16 autocast really runs in bf16.
        x_ND = x_TD.index_select(0, token_idx_N).to(dtype)  # (index_select's backward is an index_add)
    with stage("expert_gemm"):
        gate_up_N2H = grouped_mm(x_ND, gate_up_E2HD.to(dtype).transpose(-2, -1), offs_E)
        gate_NH, up_NH = gate_up_N2H.chunk(2, dim=-1)
        # silu on the strided half-view runs (and backprops) ~2x slower on CPU than on a packed copy.
        h_NH = F.silu(gate_NH.contiguous()) * up_NH
        out_ND = grouped_mm(h_NH, down_EDH.to(dtype).transpose(-2, -1), offs_E)
    with stage("dispatch"):  # the combine: weighted rows back to their tokens
        w_N1 = weights_TK.reshape(-1).index_select(0, order_N).unsqueeze(-1)
        out_ND = (out_ND * w_N1).to(x_TD.dtype)
        return torch.zeros_like(x_TD).index_add(0, token_idx_N, out_ND)
