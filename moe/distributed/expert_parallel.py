"""Expert parallelism: each rank of an expert-parallel group holds `n_experts / ep_size`
experts; routed tokens travel to them and back with `all_to_all_single`.

Stages of one MoE layer's experts (`ExpertParallel.__call__`), on every rank of the group:

    sort       assignments (token, slot) by global expert id; dropped ones (id E) left out
    counts     per-expert counts exchanged first (all_to_all_single, E / ep_size per peer),
               so every rank knows how many rows it sends to and receives from each peer
    dispatch   the rows travel to the ranks owning their experts (uneven all_to_all_single)
    compute    the configured dispatch (`experts.name`: sorted, loop, triton) runs the local
               experts on the received rows, each row a 1-slot token with weight 1
    combine    the outputs travel back (the reverse all_to_all_single), are scaled by the
               router weights and added to their tokens, exactly as the `sorted` dispatch does

The all-to-alls are autograd functions (the backward is the reverse exchange), so expert
gradients accumulate where the experts live. Under bf16 autocast the rows travel in bf16
(the experts would cast them anyway; the result is bit-identical). The local expert
weights stay plain tensors of shape [E / ep_size, ...]: DDP/FSDP leave them alone and
`reduce.reduce_expert_grads` sums their gradients over the ranks holding the same experts.

`shard_experts` replaces every MoE layer's `SwiGLUExperts` module with an
`ExpertParallelExperts` (a subclass with the same parameter names, so checkpoints keep their
keys) holding only this rank's slice; the model itself has no slot for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from moe.experts import SwiGLUExperts
from moe.profiling import stage


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, x, out_splits: list, in_splits: list, group):
        ctx.out_splits, ctx.in_splits, ctx.group = out_splits, in_splits, group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        grad_in = grad_out.new_empty((sum(ctx.in_splits),) + tuple(grad_out.shape[1:]))
        with stage("all_to_all"):
            dist.all_to_all_single(grad_in, grad_out.contiguous(), ctx.in_splits, ctx.out_splits, group=ctx.group)
        return grad_in, None, None, None


def all_to_all(x: torch.Tensor, out_splits: list, in_splits: list, group) -> torch.Tensor:
    """Rows `x[sum(in_splits[:j]) : ...]` go to peer j; returns the rows received, peer by peer."""
    return _AllToAll.apply(x, out_splits, in_splits, group)


@dataclass
class Plan:
    """Where this rank's assignments go, and what it receives."""

    order_N: torch.Tensor  # assignment indices (into experts_TK.reshape(-1)) sorted by expert
    token_idx_N: torch.Tensor  # the token of each sorted assignment
    send_splits: list  # rows sent to each peer of the group
    recv_splits: list  # rows received from each peer
    recv_expert_R: torch.Tensor  # local expert id of every received row


def plan_exchange(experts_TK: torch.Tensor, n_experts: int, group) -> Plan:
    """Sort the assignments by expert and exchange the per-expert counts (one small all-to-all
    and one host sync, for the split sizes)."""
    ep = dist.get_world_size(group)
    E_local = n_experts // ep
    K = experts_TK.shape[1]
    flat = experts_TK.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=n_experts + 1)
    send_counts_E = counts[:n_experts].contiguous()
    recv_counts_E = torch.empty_like(send_counts_E)  # [peer, local expert] counts of the rows coming here
    with stage("all_to_all"):  # the counts, and the host sync that waits for them
        dist.all_to_all_single(recv_counts_E, send_counts_E, group=group)
        splits = torch.stack([send_counts_E.view(ep, E_local).sum(1), recv_counts_E.view(ep, E_local).sum(1)]).tolist()
    send_splits, recv_splits = splits
    n_send, n_recv = sum(send_splits), sum(recv_splits)
    order = order[:n_send]  # dropped assignments (id n_experts) sort last
    local_ids = torch.arange(E_local, device=flat.device).repeat(ep)
    recv_expert_R = torch.repeat_interleave(local_ids, recv_counts_E, output_size=n_recv)
    return Plan(order, order // K, send_splits, recv_splits, recv_expert_R)


def run_local_experts(experts: nn.Module, x_RD: torch.Tensor, expert_R: torch.Tensor) -> torch.Tensor:
    """The received rows through the local experts with the configured dispatch (weight 1 each)."""
    if x_RD.shape[0] == 0:  # nothing came here: keep the graph (the backward exchange must still run)
        return x_RD * 0
    ones = torch.ones(x_RD.shape[0], 1, dtype=torch.float32, device=x_RD.device)
    return experts.dispatch(x_RD, expert_R.unsqueeze(1), ones, experts.gate_up_proj, experts.down_proj)


class ExpertParallelExperts(SwiGLUExperts):
    """This rank's `n_experts / ep_size` experts of one MoE layer (global ids
    `ep_rank * E_local ...`); `forward` exchanges the routed rows with the other ranks of the group."""

    def __init__(self, full: SwiGLUExperts, ep_rank: int, ep_size: int, group):
        nn.Module.__init__(self)
        self.n_experts, self.d_model, self.hidden = full.n_experts, full.d_model, full.hidden
        self.dispatch_name, self.dispatch = full.dispatch_name, full.dispatch
        self.ep_rank, self.ep_size, self.group = ep_rank, ep_size, group
        E_local = full.n_experts // ep_size
        lo = ep_rank * E_local
        for pname in ("gate_up_proj", "down_proj"):
            w = getattr(full, pname)
            setattr(self, pname, nn.Parameter(w.detach()[lo:lo + E_local].clone(), requires_grad=w.requires_grad))

    def forward(self, x_TD: torch.Tensor, experts_TK: torch.Tensor, weights_TK: torch.Tensor) -> torch.Tensor:
        # Ranges: `dispatch` the sort and the gathers, `all_to_all` the exchanges (forward and backward);
        # the local experts' dispatch has its own `dispatch` / `expert_gemm` ranges.
        with stage("dispatch"):
            plan = plan_exchange(experts_TK, self.n_experts, self.group)  # (its count exchange: all_to_all)
            dev = x_TD.device.type
            send_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x_TD.dtype
            x_ND = x_TD[plan.token_idx_N].to(send_dtype)
        with stage("all_to_all"):
            x_RD = all_to_all(x_ND, plan.recv_splits, plan.send_splits, self.group)  # dispatch
        y_RD = run_local_experts(self, x_RD, plan.recv_expert_R)
        with stage("all_to_all"):
            y_ND = all_to_all(y_RD, plan.send_splits, plan.recv_splits, self.group)  # combine
        with stage("dispatch"):
            w_N1 = weights_TK.reshape(-1)[plan.order_N].unsqueeze(-1)
            out_ND = (y_ND * w_N1).to(x_TD.dtype)
            return torch.zeros_like(x_TD).index_add(0, plan.token_idx_N, out_ND)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", ep_rank={self.ep_rank}/{self.ep_size}"


def shard_experts(model: nn.Module, ep_rank: int, ep_size: int, group) -> list[tuple[str, nn.Parameter]]:
    """Replace every MoE layer's experts by this rank's slice; returns (name, parameter) of the
    local expert weights. Call on identical full models (same seed) on every rank."""
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, SwiGLUExperts)]
    held = []
    for name, full in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        local = ExpertParallelExperts(full, ep_rank, ep_size, group)
        setattr(parent, attr, local)
        held += [(f"{name}.{p}", getattr(local, p)) for p in ("gate_up_proj", "down_proj")]
    return held
