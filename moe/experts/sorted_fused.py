"""`sorted_fused`: the `sorted` scheme (sort assignments by expert, one matmul per expert and
projection) as a single custom autograd Function, to cut the non-GEMM overhead on CPU.

Same math as `sorted`; what differs is the bookkeeping around the GEMMs:

* every per-expert product is written straight into its rows of one preallocated buffer
  (`torch.mm(..., out=rows)`), so nothing is concatenated, and the weight gradients are computed
  directly in the parameters' layout (`dgate_up[e] = dgu_e^T x_e`, `ddown[e] = (w dy)_e^T h_e`),
  with no transposed copies;
* SwiGLU is done in place (`silu(gate).mul_(up)`); its backward is four passes
  (`dup = dh * silu(gate)`, `dgate = silu_backward(dh * up, gate)`, the last written straight
  into the gradient buffer) from the saved pre-activations and h;
* the router weight is applied in place to the down output, and its gradient is
  `dw = (dy[token] @ down[e]) . h` (the down GEMM's input gradient, which the backward computes
  anyway, dotted with h), so the unweighted output never needs to be kept;
* only the `gate_up` pre-activations, h and the routing are saved (autograd through `sorted`
  also keeps silu(gate), the unweighted output and the gathered x); x and dy rows are gathered
  with `index_select` (their backward is the `index_add_` we do by hand).

Works on any device and dtype the matmuls support (one host sync for the group sizes, like
`sorted`); on CUDA the Triton `triton` dispatch is the fast path. Under autocast the operands
are cast to the autocast dtype (like `sorted`) and the output keeps x's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe.experts.base import EXPERT_DISPATCH
from moe.experts.grouped_mm import native_grouped_mm_ok
from moe.profiling import stage

_GROUPED_MM = getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _route(experts_TK: torch.Tensor, n_experts: int):
    """(order_N, token_idx_N, offs_E, bounds): valid assignments grouped by expert (stable), their
    tokens, the int32 group ends and the same as a Python list from 0 (one host sync)."""
    flat = experts_TK.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat.clamp(0, n_experts), minlength=n_experts + 1)
    offs_E = torch.cumsum(counts[:n_experts], 0).to(torch.int32)
    bounds = [0] + offs_E.tolist()
    order = order[: bounds[-1]]  # dropped assignments (id == n_experts) sort last
    return order, order // experts_TK.shape[1], offs_E, bounds


def _groups(bounds):
    for e in range(len(bounds) - 1):
        if bounds[e + 1] > bounds[e]:
            yield e, slice(bounds[e], bounds[e + 1])


def _gmm(a_NK: torch.Tensor, b_EKM: torch.Tensor, offs_E: torch.Tensor, bounds) -> torch.Tensor:
    """`out[rows of e] = a[rows of e] @ b[e]`: torch's grouped_mm when the operands allow it, else a
    loop of matmuls writing into one buffer."""
    if native_grouped_mm_ok(a_NK, b_EKM):
        return _GROUPED_MM(a_NK, b_EKM, offs=offs_E)
    out = a_NK.new_empty(a_NK.shape[0], b_EKM.shape[-1])
    for e, s in _groups(bounds):
        torch.mm(a_NK[s], b_EKM[e], out=out[s])
    return out


def _wgrad_ok(a_NI: torch.Tensor, b_NJ: torch.Tensor) -> bool:
    if _GROUPED_MM is None or a_NI.dtype != b_NJ.dtype or not (a_NI.is_contiguous() and b_NJ.is_contiguous()):
        return False
    if a_NI.device.type == "cpu":
        ok = a_NI.dtype in (torch.float32, torch.bfloat16)
    elif a_NI.device.type == "cuda":
        ok = a_NI.dtype == torch.bfloat16 and torch.cuda.get_device_capability(a_NI.device)[0] >= 8
    else:
        ok = False
    item = a_NI.element_size()
    return ok and (a_NI.shape[1] * item) % 16 == 0 and (b_NJ.shape[1] * item) % 16 == 0


def _wgrad(a_NI: torch.Tensor, b_NJ: torch.Tensor, offs_E: torch.Tensor, bounds, like: torch.Tensor) -> torch.Tensor:
    """`dW[e] = a[rows of e]^T @ b[rows of e]` -> `[E, I, J]` (zeros for experts without rows)."""
    if _wgrad_ok(a_NI, b_NJ):
        return _GROUPED_MM(a_NI.t(), b_NJ, offs=offs_E)
    out = torch.zeros_like(like)
    for e, s in _groups(bounds):
        torch.mm(a_NI[s].t(), b_NJ[s], out=out[e])
    return out


class SortedFusedMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_TD, weights_TK, gate_up_E2HD, down_EDH, order_N, token_idx_N, offs_E, bounds):
        H = down_EDH.shape[-1]
        x_ND = x_TD.index_select(0, token_idx_N)
        gu_N2H = _gmm(x_ND, gate_up_E2HD.transpose(-2, -1), offs_E, bounds)
        h_NH = F.silu(gu_N2H[:, :H]).mul_(gu_N2H[:, H:])
        out_ND = _gmm(h_NH, down_EDH.transpose(-2, -1), offs_E, bounds)
        w_N = weights_TK.reshape(-1).index_select(0, order_N)
        out_ND.mul_(w_N.to(out_ND.dtype)[:, None])
        y_TD = torch.zeros_like(x_TD).index_add_(0, token_idx_N, out_ND)
        ctx.save_for_backward(x_TD, gate_up_E2HD, down_EDH, gu_N2H, h_NH, w_N, order_N, token_idx_N, offs_E)
        ctx.bounds, ctx.w_shape = bounds, weights_TK.shape
        return y_TD

    @staticmethod
    def backward(ctx, dy_TD):
        x_TD, gate_up_E2HD, down_EDH, gu_N2H, h_NH, w_N, order_N, token_idx_N, offs_E = ctx.saved_tensors
        bounds = ctx.bounds
        need_x, need_w, need_gu, need_down = ctx.needs_input_grad[:4]
        H = down_EDH.shape[-1]
        N = order_N.numel()
        dy_ND = dy_TD.to(x_TD.dtype).index_select(0, token_idx_N)
        g_NH = _gmm(dy_ND, down_EDH, offs_E, bounds)  # dy[token] @ down[e]: grad of the unweighted h row
        dweights = None
        if need_w:  # dw = dy[token] . (h @ down[e]^T) = g . h
            dw_N = torch.linalg.vecdot(g_NH, h_NH) if g_NH.dtype == torch.float32 \
                else torch.linalg.vecdot(g_NH.float(), h_NH.float())
            dweights = torch.zeros(ctx.w_shape.numel(), dtype=w_N.dtype, device=w_N.device)
            dweights.index_copy_(0, order_N, dw_N.to(w_N.dtype))
            dweights = dweights.view(ctx.w_shape)
        wc = w_N.to(g_NH.dtype)[:, None]
        dh = g_NH.mul_(wc)
        gate, up = gu_N2H[:, :H], gu_N2H[:, H:]
        dgu_N2H = x_TD.new_empty(N, 2 * H)
        torch.mul(dh, F.silu(gate), out=dgu_N2H[:, H:])  # d up = dh * silu(gate)
        torch.ops.aten.silu_backward.grad_input(dh.mul_(up), gate, grad_input=dgu_N2H[:, :H])  # d gate
        ddown = dgate_up = dx = None
        if need_down:
            ddown = _wgrad(dy_ND.mul_(wc), h_NH, offs_E, bounds, down_EDH)
        if need_gu:
            dgate_up = _wgrad(dgu_N2H, x_TD.index_select(0, token_idx_N), offs_E, bounds, gate_up_E2HD)
        if need_x:
            dx = torch.zeros_like(x_TD).index_add_(0, token_idx_N, _gmm(dgu_N2H, gate_up_E2HD, offs_E, bounds))
        return dx, dweights, dgate_up, ddown, None, None, None, None


@EXPERT_DISPATCH.register("sorted_fused")
def sorted_fused_dispatch(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH) -> torch.Tensor:
    dev = x_TD.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x_TD.dtype
    with stage("dispatch"):
        order_N, token_idx_N, offs_E, bounds = _route(experts_TK, gate_up_E2HD.shape[0])
    # One autograd Function gathers, multiplies and scatters back: all of it counts as expert_gemm.
    with torch.autocast(dev, enabled=False), stage("expert_gemm"):
        y = SortedFusedMLP.apply(x_TD.to(dtype).contiguous(), weights_TK, gate_up_E2HD.to(dtype).contiguous(),
                                 down_EDH.to(dtype).contiguous(), order_N, token_idx_N, offs_E, bounds)
    return y.to(x_TD.dtype)
