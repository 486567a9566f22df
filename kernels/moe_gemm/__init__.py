"""Triton grouped-GEMM kernels for the MoE experts (ScatterMoE-style "scatter2scatter").

Tokens are never copied into a permuted or padded buffer. The T*K (token, slot) assignments are
sorted by expert once (`moe_routing`, plain PyTorch, no host sync); the kernels then receive that
order (`sorted_token`, `sorted_assign`), the group offsets and a block -> expert map, and gather
input rows by index inside the kernel. Each program computes a `BLOCK_M x BLOCK_N` tile of
`rows @ B_e` for the one expert `e` its row block belongs to (a block never straddles two experts),
and writes it either in *grouped* order (row = sorted position) or *scattered* to the assignment's
row `t * K + k`.

Notation: T tokens, K = top_k, N = T*K assignments, E experts, D model size, H expert hidden size.
Expert id `E` (or anything outside `[0, E)`) marks a dropped assignment: its output rows are zeros
and it receives no gradient. Dropped assignments form a last group `E` in the sorted order whose
row blocks only write zeros, so no output needs a memset and no buffer holds garbage.

Kernels (each with a plain PyTorch `*_reference` in `reference.py` that defines its semantics):

* `grouped_gemm(x, w, routing, x_grouped, y_grouped, trans_w, scale)`:
  `y[out(p)] = scale[p] * x[in(p)] @ W[e_p]^T` (or `@ W[e_p]` with `trans_w=False`), where `in(p)`
  is `sorted_token[p]` (gather from token rows) or `p` (grouped input), `out(p)` is
  `sorted_assign[p]` (scatter to assignment rows) or `p` (grouped output).
* `gate_up_swiglu(x, gate_up, routing)`: the first expert GEMM with a fused SwiGLU epilogue; one
  program accumulates the gate tile and the matching up tile (rows `j` and `H + j` of
  `gate_up[e]`), returns `h = silu(gate) * up` grouped `[N, H]` and (for the backward) the
  pre-activations `gu = [gate, up]` grouped `[N, 2H]`.
* `swiglu_down_backward(dy, down, gu, w_sorted, routing)`: the input-gradient GEMM of the down
  projection, `g[p] = dy[sorted_token[p]] @ down[e_p]` (gathering dy by token), with a fused
  epilogue that recomputes `h` from `gu`, applies the router weight and the SwiGLU backward
  (-> `dgu`), and reduces the router-weight gradient `dw[p] = g[p] . h[p]` per column tile.
* `group_weight_grad(a, b, routing, ...)`: the per-expert weight-gradient GEMM
  `dW[e] = sum_{p in group e} (scale[p] * a[row_a(p)])^T b[row_b(p)]`; one program per
  (expert, tile of dW[e]) loops over its expert's rows.

The expert MLP built from these four kernels is `mlp.py` (forward: routing, gate_up_swiglu,
grouped_gemm scattered with the router weight; backward: swiglu_down_backward, grouped_gemm for
dx, two group_weight_grad for the weights; the router-weight gradient comes out of the fused
epilogue). Its autograd Function and the `moe_mlp` op live with the `triton` expert dispatch, in
`moe/experts/triton_mlp.py`: kernels, autograd and module in separate files (as ScatterMoE does).

Combining a token's K contributions: the down GEMM writes one row per (token, slot) -- row
`t * K + k` of a `[T*K, D]` buffer -- and PyTorch sums the K rows (`view(T, K, D).sum(1)`). We chose
this over `tl.atomic_add` into `[T, D]` because it is deterministic, works for bf16/fp16 outputs
(bf16 atomics need sm_90 and lose precision; fp32 atomics would need an fp32 output buffer and a
cast), never needs a zeroed output or `reset_to_zero` when autotuning, and runs in the
interpreter. The cost is one extra `T*K*D` write + read, small next to the GEMMs (their FLOPs grow
with D*H; the buffer with D only). The same scheme gives dx in the backward.

Accumulation is always fp32; inputs may be fp32, fp16 or bf16 (x and the weights share a dtype).
fp32 products are exact IEEE unless `torch.backends.cuda.matmul.allow_tf32` is set (the same
switch `F.linear` obeys). On CUDA the GEMM kernels are autotuned (`BLOCK_M` is fixed by the
routing, 128 by default; the autotuner picks `BLOCK_N`/`BLOCK_K`/warps/stages); on CPU they run only
under `TRITON_INTERPRET=1` with one small config (the interpreter's `tl.dot` is wrong for bf16,
so there 16-bit tiles are upcast to fp32 before the dot). Kernels are jit-compiled on first launch,
so `TRITON_INTERPRET` is read at that moment, not at import (`kernels/runtime.py`).

Files: `routing.py` (MoERouting, moe_routing), `checks.py` (launcher input checks),
`reference.py` (the PyTorch references), `triton_kernels.py` (the kernels), `configs.py` (tile
sizes and autotune tables), `launch.py` (the launchers), `mlp.py` (the MLP's forward/backward).
"""

from kernels.moe_gemm.configs import CUDA_BLOCK_M
from kernels.moe_gemm.launch import (gate_up_swiglu, group_weight_grad, grouped_gemm, runnable_reason,
                                     swiglu_down_backward)
from kernels.moe_gemm.mlp import expert_mlp_backward, expert_mlp_forward, sorted_weights
from kernels.moe_gemm.reference import (gate_up_swiglu_reference, group_weight_grad_reference,
                                        grouped_gemm_reference, moe_mlp_reference, swiglu_down_backward_reference)
from kernels.moe_gemm.routing import MoERouting, moe_routing

__all__ = ["CUDA_BLOCK_M", "MoERouting", "moe_routing", "grouped_gemm", "gate_up_swiglu", "swiglu_down_backward",
           "group_weight_grad", "runnable_reason", "expert_mlp_forward", "expert_mlp_backward", "sorted_weights",
           "grouped_gemm_reference", "gate_up_swiglu_reference", "swiglu_down_backward_reference",
           "group_weight_grad_reference", "moe_mlp_reference"]
