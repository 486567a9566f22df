"""The experts of a one-token step: only the k experts the token chose, each one matmul pair.

The model's default dispatch (`moe/experts/sorted.py`) runs `grouped_mm` over all E experts;
on CPU that is a loop over every expert's group, so a single decoding token (k = 2 of 8 groups
non-empty) pays the empty groups' calls too (measured ~1.3-1.6x the two experts it needs, at
the `benchmarks/generate.py` model's shapes; HF's Mixtral pays the same grouped_mm). At one
token the runner swaps this in (`one_token_experts`): the same ops per expert in the same order
(gather, `x @ W.T` (as `F.linear`), SwiGLU on a packed copy, `@ down.T`, weight, `index_add` in
ascending expert order), so the output is the `sorted` dispatch's, bit for bit on CPU
(tests/engine/runner/test_decode_fast_paths.py). With two or more tokens the grouped call is as
fast or faster, and it is kept.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from moe.experts.base import EXPERT_DISPATCH, SwiGLUExperts
from moe.profiling import stage


def active_experts_dispatch(x_TD, experts_TK, weights_TK, gate_up_E2HD, down_EDH) -> torch.Tensor:
    """`sorted_dispatch` for a few tokens: a loop over the experts they chose (one host read of
    `experts_TK`), nothing for the others. Dropped assignments (id E) are skipped, as there."""
    # one profiler range for all of it, as the `loop` reference's (its gathers and scatters are per expert too)
    with stage("expert_gemm"):
        K, E = experts_TK.shape[1], gate_up_E2HD.shape[0]
        chosen: dict[int, list[int]] = {}
        for n, e in enumerate(experts_TK.reshape(-1).tolist()):
            if e < E:
                chosen.setdefault(e, []).append(n)
        w_N = weights_TK.reshape(-1)
        y_TD = torch.zeros_like(x_TD)
        for e in sorted(chosen):
            slots = chosen[e]
            if x_TD.shape[0] == 1 and len(slots) == 1:
                # One token, one slot (a decode step): its row and weight are views, no index tensors
                # built; the same ops on the same values as below (one row added is index_add_'s sum).
                n = slots[0]
                x_in, w_in, token_idx = x_TD, w_N[n:n + 1], None
            else:
                n_idx = torch.tensor(slots, device=x_TD.device)
                token_idx = n_idx // K
                x_in, w_in = x_TD.index_select(0, token_idx), w_N.index_select(0, n_idx)
            # (F.linear(x, W) is matmul(x, W.t()) inside ATen: the same product as `x @ W[e].transpose(-2, -1)`,
            # in fewer calls)
            gate_up = F.linear(x_in, gate_up_E2HD[e])
            gate, up = gate_up.chunk(2, dim=-1)
            out = F.linear(F.silu(gate.contiguous()) * up, down_EDH[e])
            contribution = out * w_in.unsqueeze(-1)
            if contribution.dtype != x_TD.dtype:
                contribution = contribution.to(x_TD.dtype)
            if token_idx is None:
                y_TD.add_(contribution)
            else:
                y_TD.index_add_(0, token_idx, contribution)
        return y_TD


def swappable_experts(model, device: torch.device) -> list[SwiGLUExperts]:
    """The expert modules `one_token_experts` may swap: plain SwiGLU experts (not quantized, not
    biased), on the CPU only (the loop reads the chosen experts on the host: a device sync per layer
    on a GPU, where the grouped GEMM is one kernel anyway)."""
    if device.type != "cpu":
        return []
    return [m for m in model.modules() if type(m) is SwiGLUExperts]


@contextlib.contextmanager
def one_token_experts(experts: list[SwiGLUExperts], num_tokens: int):
    """Within: those of `experts` on the `sorted` dispatch run `active_experts_dispatch` when the
    step has one token (any other dispatch, or more tokens: unchanged)."""
    sorted_fn = EXPERT_DISPATCH.get("sorted")
    swapped = [m for m in experts if m.dispatch is sorted_fn] if num_tokens == 1 else []
    # `dispatch` is a plain attribute (a function: no parameter, buffer or module), so object.__setattr__
    # stores it where Module.__setattr__ would, without the latter's ~1.2 us of checks (8 sets a step)
    for m in swapped:
        object.__setattr__(m, "dispatch", active_experts_dispatch)
    try:
        yield
    finally:
        for m in swapped:
            object.__setattr__(m, "dispatch", sorted_fn)
