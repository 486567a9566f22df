"""Plain PyTorch references of the MoE kernels: they define the semantics the Triton kernels are
tested against (`tests/kernels/test_moe_gemm_launch.py`), one loop over experts each, fp32 math."""

from __future__ import annotations

from typing import Optional

import torch

from kernels.moe_gemm.routing import MoERouting


def _rows(t: torch.Tensor, routing: MoERouting, grouped: bool) -> torch.Tensor:
    """The row of `t` each sorted position reads: itself (grouped) or its token."""
    return t if grouped else t[routing.sorted_token.long()]


def _per_group(routing: MoERouting):
    offs = routing.group_offs.tolist()
    for e in range(routing.n_experts):
        if offs[e + 1] > offs[e]:
            yield e, slice(offs[e], offs[e + 1])


def _place(out_grouped: torch.Tensor, routing: MoERouting, y_grouped: bool) -> torch.Tensor:
    if y_grouped:
        return out_grouped
    out = torch.empty_like(out_grouped)
    out[routing.sorted_assign.long()] = out_grouped
    return out


def grouped_gemm_reference(x, w, routing: MoERouting, *, x_grouped: bool, y_grouped: bool, trans_w: bool = True,
                           scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Loop over experts: `y[out(p)] = scale[p] * x[in(p)] @ (W[e]^T if trans_w else W[e])`, fp32 math,
    zeros for dropped assignments; returns x's dtype, `[N, out]`."""
    xs = _rows(x, routing, x_grouped).float()
    n_out = w.shape[1] if trans_w else w.shape[2]
    out = xs.new_zeros(routing.n_assign, n_out)
    for e, sl in _per_group(routing):
        we = w[e].float()
        out[sl] = xs[sl] @ (we.t() if trans_w else we)
    if scale is not None:
        out = out * torch.where(routing.sorted_expert < routing.n_experts, scale, 0.0)[:, None]
    return _place(out.to(x.dtype), routing, y_grouped)


def gate_up_swiglu_reference(x, gate_up, routing: MoERouting, *, x_grouped: bool = False):
    """`(h [N, H], gu [N, 2H])`, grouped: `gu = x[in(p)] @ gate_up[e]^T` rounded to x's dtype,
    `h = silu(gate) * up` computed in fp32 from the rounded values."""
    gu = grouped_gemm_reference(x, gate_up, routing, x_grouped=x_grouped, y_grouped=True)
    gate, up = gu.float().chunk(2, dim=-1)
    h = torch.nn.functional.silu(gate) * up
    return h.to(x.dtype), gu


def swiglu_down_backward_reference(dy, down, gu, w_sorted, routing: MoERouting):
    """`(dgu [N, 2H], h [N, H], dw_sorted [N] fp32)`: `g = dy[token(p)] @ down[e]` (fp32),
    `h = silu(gate) * up` (rounded to the dtype), `dw = g . h`, `dh = w * g`, SwiGLU backward."""
    g = dy.new_zeros(routing.n_assign, down.shape[2], dtype=torch.float32)  # fp32, like the kernel's accumulator
    dys = dy[routing.sorted_token.long()].float()
    for e, sl in _per_group(routing):
        g[sl] = dys[sl] @ down[e].float()
    gate, up = gu.float().chunk(2, dim=-1)
    sig = torch.sigmoid(gate)
    h = (gate * sig * up).to(dy.dtype)
    dw = (g * h.float()).sum(-1)
    dh = g * torch.where(routing.sorted_expert < routing.n_experts, w_sorted, 0.0)[:, None]
    dgate = dh * up * sig * (1 + gate * (1 - sig))
    dup = dh * gate * sig
    return torch.cat([dgate, dup], dim=-1).to(dy.dtype), h, dw


def group_weight_grad_reference(a, b, routing: MoERouting, *, a_grouped: bool, b_grouped: bool,
                                scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`dW[e] = sum_{p in e} (scale[p] * a[row_a(p)])^T @ b[row_b(p)]`, `[E, a_cols, b_cols]`, fp32 math,
    `a`'s dtype (the scaled rows are rounded to that dtype first, as autograd would)."""
    As = _rows(a, routing, a_grouped)
    if scale is not None:
        As = (As.float() * scale[:, None]).to(a.dtype)
    Bs = _rows(b, routing, b_grouped)
    dw = a.new_zeros(routing.n_experts, a.shape[1], b.shape[1], dtype=torch.float32)
    for e, sl in _per_group(routing):
        dw[e] = As[sl].float().t() @ Bs[sl].float()
    return dw.to(a.dtype)


def moe_mlp_reference(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH) -> torch.Tensor:
    """Plain PyTorch: per expert, gather its tokens, SwiGLU MLP, weight, index_add back."""
    y = torch.zeros_like(x_TD, dtype=torch.float32)
    H = down_EDH.shape[-1]
    for e in range(gate_up_E2HD.shape[0]):
        t, k = torch.where(experts_TK == e)
        if t.numel():
            gu = x_TD[t].float() @ gate_up_E2HD[e].float().t()
            h = torch.nn.functional.silu(gu[:, :H]) * gu[:, H:]
            y.index_add_(0, t, (h @ down_EDH[e].float().t()) * weights_TK[t, k].float()[:, None])
    return y.to(x_TD.dtype)
