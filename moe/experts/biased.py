"""Experts with projection biases and/or another activation than plain SwiGLU (GPT-OSS).

`BiasedExperts` keeps `SwiGLUExperts`' weight layout (`gate_up_proj [E, 2H, D]`, gate rows
first, `down_proj [E, D, H]`) and adds, with `model.expert_bias`, `gate_up_proj_bias [E, 2H]`
and `down_proj_bias [E, D]`; `model.expert_activation` picks the activation:

* `swiglu`: silu(gate) * up;
* `clamped_swiglu` (GPT-OSS): gate clamped above at `limit`, up clamped to [-limit, limit],
  then (up + 1) * gate * sigmoid(alpha * gate) (HF's `GptOssExperts._apply_gate`).

The router weight scales the whole expert output, down bias included, as HF does. It is its own
class (not a `SwiGLUExperts`) so that code that rewrites `SwiGLUExperts` for its plain layout
(weight quantization, expert parallelism) leaves it alone rather than dropping its biases or
its activation. Two dispatches: `loop` (the per-expert reference) and `sorted` (grouped
matmuls); the other `experts.name` values have no bias / activation path and are refused.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from moe.errors import ConfigError
from moe.experts.grouped_mm import grouped_mm
from moe.experts.loop import loop_over_experts
from moe.experts.sorted import sort_by_expert

DISPATCHES = ("loop", "sorted")


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * row_local_sigmoid(gate * alpha))


def row_local_sigmoid(z: torch.Tensor) -> torch.Tensor:
    """sigmoid(z) whose value in a row does not depend on how many rows are computed together.

    On CPU an elementwise op over a contiguous buffer runs the vectorised sigmoid on whole vector
    widths and the scalar one on the last (numel mod width) elements, and the two differ in the
    last bit; so the same row would round differently in a batch of another size (the expert cache
    runs a forward's rows in chunks and must equal the resident layer, moe/engine/offload/). Written
    into a strided view, rows cannot be fused into one buffer: each row is one loop of its own.
    (Not under autograd, which refuses `out=`: training does not chunk.)"""
    if z.dim() < 2 or z.device.type != "cpu" or (torch.is_grad_enabled() and z.requires_grad):
        return torch.sigmoid(z)
    out = z.new_empty(*z.shape[:-1], z.shape[-1] + 1)[..., :-1]
    return torch.sigmoid(z, out=out)


class BiasedExperts(nn.Module):
    def __init__(self, n_experts: int, d_model: int, hidden: int, dispatch: str = "sorted", *,
                 activation: str = "swiglu", alpha: float = 1.702, limit: float = 7.0, bias: bool = False):
        super().__init__()
        if dispatch not in DISPATCHES:
            raise ConfigError(f"experts.name={dispatch!r} has no path for model.expert_bias / "
                              f"model.expert_activation={activation!r}; choose experts.name in {list(DISPATCHES)}")
        self.n_experts, self.d_model, self.hidden = n_experts, d_model, hidden
        self.dispatch_name, self.activation, self.alpha, self.limit = dispatch, activation, alpha, limit
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * hidden, d_model))
        self.down_proj = nn.Parameter(torch.empty(n_experts, d_model, hidden))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(n_experts, 2 * hidden)) if bias else None
        self.down_proj_bias = nn.Parameter(torch.empty(n_experts, d_model)) if bias else None

    def act(self, gate_up_N2H: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up_N2H.chunk(2, dim=-1)
        if self.activation == "clamped_swiglu":
            return clamped_swiglu(gate, up, self.alpha, self.limit)
        return F.silu(gate) * up

    def _bias(self, bias: Optional[torch.Tensor], rows: torch.Tensor) -> torch.Tensor | float:
        return 0.0 if bias is None else bias.index_select(0, rows)

    def forward(self, x_TD: torch.Tensor, experts_TK: torch.Tensor, weights_TK: torch.Tensor) -> torch.Tensor:
        if self.dispatch_name == "loop":
            return self._loop(x_TD, experts_TK, weights_TK)
        E = self.n_experts
        order_N, token_idx_N, offs_E = sort_by_expert(experts_TK, E)
        expert_N = experts_TK.reshape(-1).index_select(0, order_N)
        x_ND = x_TD.index_select(0, token_idx_N)
        gate_up_N2H = grouped_mm(x_ND, self.gate_up_proj.transpose(-2, -1), offs_E) \
            + self._bias(self.gate_up_proj_bias, expert_N)
        out_ND = grouped_mm(self.act(gate_up_N2H), self.down_proj.transpose(-2, -1), offs_E) \
            + self._bias(self.down_proj_bias, expert_N)
        w_N1 = weights_TK.reshape(-1).index_select(0, order_N).unsqueeze(-1)
        return torch.zeros_like(x_TD).index_add(0, token_idx_N, (out_ND * w_N1).to(x_TD.dtype))

    def _loop(self, x_TD, experts_TK, weights_TK) -> torch.Tensor:
        def expert(e, x_ND):
            b_gu = None if self.gate_up_proj_bias is None else self.gate_up_proj_bias[e]
            b_d = None if self.down_proj_bias is None else self.down_proj_bias[e]
            return F.linear(self.act(F.linear(x_ND, self.gate_up_proj[e], b_gu)), self.down_proj[e], b_d)

        return loop_over_experts(x_TD, experts_TK, weights_TK, self.n_experts, expert)

    def extra_repr(self) -> str:
        return (f"n_experts={self.n_experts}, d_model={self.d_model}, hidden={self.hidden}, "
                f"dispatch={self.dispatch_name}, activation={self.activation}, bias={self.gate_up_proj_bias is not None}")
