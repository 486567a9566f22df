"""The router balance loss over the global batch.

The Switch/GShard loss `E * sum_i f_i * P_i` is not linear in the batch: computed per rank
it is a different loss from the one a single process computes on the same global batch.
With `distributed.global_balance` (default) each MoE layer all-reduces the per-expert
assignment counts (f) and router probability sums (P) over the data-parallel ranks, so every
rank computes the loss of the global micro-batch, and the logged `aux_loss` is the global
one. The all-reduce is differentiable (`differentiable_all_reduce`: its backward sums the
gradients of all ranks), and DDP/FSDP average gradients over the ranks,
so the gradient is exactly that of the single-process loss.

Routers whose balance loss is this one (`topk`, `switch`, `sinkhorn`, `aux_free`) get it, as a
forward hook that replaces the router's output (in training forwards with autograd on; evaluation
and the no-grad routing probes see the router's own, per-rank statistics); `expert_choice` (no
balance loss) and `hash` (nothing learned) are left as they are. The statistics travel on a
process group of their own, so this collective, which runs inside forward and backward, never
queues behind DDP's or FSDP's gradient traffic.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from moe.routing.routers import Router, RouterConfig

GLOBAL_BALANCE_ROUTERS = ("topk", "switch", "sinkhorn", "aux_free")


class _SumAllReduce(torch.autograd.Function):
    """A sum all-reduce whose backward is the sum all-reduce of the gradients. Written here because
    `torch.distributed.nn.functional.all_reduce`, which did exactly this, is deprecated (a
    FutureWarning on every rank, every run) and its suggested replacement, the functional
    collectives' `all_reduce`, has no autograd formula."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        out = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _SumAllReduce.apply(grad, ctx.group), None


def differentiable_all_reduce(tensor: torch.Tensor, group) -> torch.Tensor:
    """Sum of `tensor` over the ranks of `group`, differentiable (gradients summed over ranks)."""
    return _SumAllReduce.apply(tensor, group)


class GlobalBalance:
    """The router's output with the balance loss of the global micro-batch."""

    def __init__(self, cfg: RouterConfig, n_experts: int, group):
        self.cfg, self.n_experts, self.group = cfg, n_experts, group

    def __call__(self, route):
        E = self.n_experts
        sel_TK = route.selected_TK if route.selected_TK is not None else route.experts_TK
        probs_TE = route.probs_TE
        counts_E = torch.bincount(sel_TK.reshape(-1), minlength=E + 1)[:E].to(probs_TE.dtype)
        sizes = probs_TE.new_tensor([float(sel_TK.numel()), float(probs_TE.shape[0])])
        stats = differentiable_all_reduce(torch.cat([probs_TE.sum(0), counts_E, sizes]), self.group)
        n_assign, n_tokens = stats[2 * E].clamp_min(1), stats[2 * E + 1].clamp_min(1)
        f_E = stats[E:2 * E].detach() / n_assign
        P_E = stats[:E] / n_tokens
        aux = E * torch.sum(f_E * P_E)
        c, zc = self.cfg.aux_loss_coef, self.cfg.z_loss_coef
        # What the router added besides these two terms (aux_free's sequence loss); exactly 0 otherwise.
        extra = route.loss - (c * route.aux_loss + zc * route.z_loss)
        loss = c * aux + zc * route.z_loss + extra
        return dataclasses.replace(route, aux_loss=aux, loss=loss)


def attach_global_balance(model, group) -> list:
    """Give every router with a Switch-style balance loss the global version (a forward hook);
    returns the hook handles (`handle.remove()` detaches one)."""
    handles = []
    for m in model.modules():
        if isinstance(m, Router) and m.cfg.name in GLOBAL_BALANCE_ROUTERS:
            balance = GlobalBalance(m.cfg, m.n_experts, group)

            def hook(module, args, out, balance=balance):
                return balance(out) if module.training and torch.is_grad_enabled() else out
            handles.append(m.register_forward_hook(hook))
    return handles
