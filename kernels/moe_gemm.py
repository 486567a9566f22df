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

Kernels (each with a plain PyTorch `*_reference` below that defines its semantics):

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

`moe_mlp(x, experts_TK, weights_TK, gate_up, down)` is the full expert MLP as an autograd
Function built from these four kernels (forward: routing, gate_up_swiglu, grouped_gemm scattered
with the router weight; backward: swiglu_down_backward, grouped_gemm for dx, two
group_weight_grad for the weights; the router-weight gradient comes out of the fused epilogue).

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
so `TRITON_INTERPRET` is read at that moment, not at import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the references still work; the launchers raise a clear error
    triton = None

    class tl:  # noqa: N801  (stand-in so the kernel definitions below still parse)
        constexpr = None


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Tile sizes. Under the interpreter: one small config (the interpreter is slow per program and per
# op, so few, mid-sized tiles are fastest). On CUDA: BLOCK_M from the routing, the rest autotuned.
INTERPRET_BLOCK_M = 64
INTERPRET_GEMM = dict(BLOCK_N=64, BLOCK_K=64)
INTERPRET_WGRAD = dict(BLOCK_I=64, BLOCK_J=64, BLOCK_K=64)
CUDA_BLOCK_M = 128


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def runnable_reason(device: Optional[torch.device] = None) -> Optional[str]:
    """None when the Triton kernels can run on `device` (default: anywhere available), else why not."""
    if triton is None:
        return "the Triton MoE kernels need the `triton` package (pip install triton)"
    if _interpreting():
        return None
    if device is None:
        ok = torch.cuda.is_available()
    else:
        ok = torch.device(device).type == "cuda"
    if not ok:
        where = "this machine has no CUDA device" if device is None else f"got tensors on {device}"
        return (f"the Triton MoE kernels run on CUDA tensors ({where}); on CPU set TRITON_INTERPRET=1 "
                "before the first launch (slow, for tests) or use experts.name=sorted")
    return None


# ================================================================================ routing

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
        block_m = CUDA_BLOCK_M if experts_TK.device.type == "cuda" and not _interpreting() else INTERPRET_BLOCK_M
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


# ================================================================================ input checks

def _fail(msg: str):
    raise ValueError(msg)


def _check_act(name: str, t: torch.Tensor, rows: int, cols: Optional[int], routing: MoERouting, what: str):
    if t.dim() != 2:
        _fail(f"{what}: {name} must be 2-D [rows, features]; got shape {tuple(t.shape)}")
    if t.shape[0] != rows or (cols is not None and t.shape[1] != cols):
        want = f"[{rows}, {cols if cols is not None else '*'}]"
        _fail(f"{what}: {name} must be {want}; got {tuple(t.shape)}")
    if t.dtype not in FLOAT_DTYPES:
        _fail(f"{what}: {name} dtype {t.dtype} is not one of {FLOAT_DTYPES}")
    if t.device != routing.device:
        _fail(f"{what}: {name} is on {t.device} but the routing on {routing.device}")
    if t.shape[1] > 1 and t.stride(1) != 1:
        _fail(f"{what}: {name} must have unit stride in its last dim (call .contiguous()); strides {t.stride()}")


def _check_weight(name: str, w: torch.Tensor, routing: MoERouting, dtype: torch.dtype, what: str):
    if w.dim() != 3 or w.shape[0] != routing.n_experts:
        _fail(f"{what}: {name} must be [n_experts={routing.n_experts}, out, in]; got shape {tuple(w.shape)}")
    if w.dtype != dtype:
        _fail(f"{what}: {name} dtype {w.dtype} != activation dtype {dtype} (cast both to one dtype)")
    if w.device != routing.device:
        _fail(f"{what}: {name} is on {w.device} but the routing on {routing.device}")
    if not w.is_contiguous():
        _fail(f"{what}: {name} must be contiguous (call .contiguous()); strides {w.stride()}")


def _check_scale(scale: Optional[torch.Tensor], routing: MoERouting, what: str):
    if scale is None:
        return
    if scale.shape != (routing.n_assign,) or scale.dtype != torch.float32 or not scale.is_contiguous():
        _fail(f"{what}: scale must be a contiguous fp32 [N={routing.n_assign}] tensor in sorted order; "
              f"got {scale.dtype} of shape {tuple(scale.shape)}")
    if scale.device != routing.device:
        _fail(f"{what}: scale is on {scale.device} but the routing on {routing.device}")


def _check_launch(*tensors: torch.Tensor) -> None:
    reason = runnable_reason(tensors[0].device)
    if reason is not None:
        raise RuntimeError(reason)


# ================================================================================ references

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


# ================================================================================ Triton kernels
# Plain functions; `_Kernel` jit-compiles them (and wraps them in the autotuner on CUDA) on first
# launch. EPILOGUE: 0 = plain (optional per-row scale), 1 = SwiGLU forward (two accumulators),
# 2 = SwiGLU backward of the down projection (loads gu, writes dgu, h and the dw partials).

def _grouped_gemm_kernel(X, W, Y, GU, DGU, DWP, IN_IDX, OUT_IDX, SCALE, BLOCK_GROUP, BLOCK_START, GROUP_OFFS,
                         N_OUT, K_IN, n_experts,
                         stride_xm, stride_xk, stride_we, stride_wk, stride_wn, stride_ym, stride_yn,
                         stride_gm, stride_gn, stride_dgm, stride_dgn, stride_dwm, stride_dwn,
                         X_GROUPED: tl.constexpr, Y_GROUPED: tl.constexpr, HAS_SCALE: tl.constexpr,
                         EPILOGUE: tl.constexpr, STORE_GU: tl.constexpr, UPCAST: tl.constexpr,
                         IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    grp = tl.load(BLOCK_GROUP + pid_m)
    if grp >= 0:
        real = grp < n_experts  # False: the dropped group, whose rows only get zeros
        start = tl.load(BLOCK_START + pid_m)
        end = tl.load(GROUP_OFFS + grp + 1)
        p = start + tl.arange(0, BLOCK_M)
        mask_m = p < end
        mask_mr = p < tl.where(real, end, 0)  # mask_m, and False in the dropped group
        p64 = p.to(tl.int64)
        if X_GROUPED:
            in_rows = p64
        else:
            in_rows = tl.load(IN_IDX + p, mask=mask_m, other=0).to(tl.int64)
        if Y_GROUPED:
            out_rows = p64
        else:
            out_rows = tl.load(OUT_IDX + p, mask=mask_m, other=0).to(tl.int64)
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = n < N_OUT
        k = tl.arange(0, BLOCK_K)
        x_ptrs = X + in_rows[:, None] * stride_xm + k[None, :] * stride_xk
        w_ptrs = W + grp.to(tl.int64) * stride_we + k[:, None] * stride_wk + n[None, :] * stride_wn
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        k_hi = tl.where(real, K_IN, 0)
        for k0 in range(0, k_hi, BLOCK_K):
            mask_k = (k0 + k) < K_IN
            xt = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            wt = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            if UPCAST:
                xt = xt.to(tl.float32)
                wt = wt.to(tl.float32)
            if IEEE:
                acc += tl.dot(xt, wt, input_precision="ieee")
            else:
                acc = tl.dot(xt, wt, acc)
            if EPILOGUE == 1:  # the up rows sit N_OUT rows below the gate rows
                wu = tl.load(w_ptrs + N_OUT * stride_wn, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
                if UPCAST:
                    wu = wu.to(tl.float32)
                if IEEE:
                    acc_up += tl.dot(xt, wu, input_precision="ieee")
                else:
                    acc_up = tl.dot(xt, wu, acc_up)
            x_ptrs += BLOCK_K * stride_xk
            w_ptrs += BLOCK_K * stride_wk

        mask = mask_m[:, None] & mask_n[None, :]
        y_ptrs = Y + out_rows[:, None] * stride_ym + n[None, :] * stride_yn
        if EPILOGUE == 0:
            if HAS_SCALE:
                s = tl.load(SCALE + p, mask=mask_mr, other=0.0).to(tl.float32)
                acc = acc * s[:, None]
            tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=mask)
        elif EPILOGUE == 1:
            # Round the pre-activations to the storage dtype first, so the forward's h equals the
            # h the backward recomputes from the stored gu (and the unfused reference).
            gate = acc.to(Y.dtype.element_ty).to(tl.float32)
            up = acc_up.to(Y.dtype.element_ty).to(tl.float32)
            if STORE_GU:
                gu_ptrs = GU + p64[:, None] * stride_gm + n[None, :] * stride_gn
                tl.store(gu_ptrs, gate.to(GU.dtype.element_ty), mask=mask)
                tl.store(gu_ptrs + N_OUT * stride_gn, up.to(GU.dtype.element_ty), mask=mask)
            h = gate * tl.sigmoid(gate) * up
            tl.store(y_ptrs, h.to(Y.dtype.element_ty), mask=mask)
        else:
            # acc = g = dy[token] @ down[e]; Y = h out (grouped), GU = saved pre-activations.
            lmask = mask_mr[:, None] & mask_n[None, :]
            gu_ptrs = GU + p64[:, None] * stride_gm + n[None, :] * stride_gn
            gate = tl.load(gu_ptrs, mask=lmask, other=0.0).to(tl.float32)
            up = tl.load(gu_ptrs + N_OUT * stride_gn, mask=lmask, other=0.0).to(tl.float32)
            sig = tl.sigmoid(gate)
            silu = gate * sig
            h = (silu * up).to(Y.dtype.element_ty)
            tl.store(y_ptrs, h, mask=mask)
            dwp = tl.sum(tl.where(mask, acc * h.to(tl.float32), 0.0), axis=1)
            tl.store(DWP + p64 * stride_dwm + pid_n * stride_dwn, dwp, mask=mask_m)
            s = tl.load(SCALE + p, mask=mask_mr, other=0.0).to(tl.float32)
            dh = acc * s[:, None]
            dgate = dh * up * sig * (1.0 + gate * (1.0 - sig))
            dup = dh * silu
            dg_ptrs = DGU + p64[:, None] * stride_dgm + n[None, :] * stride_dgn
            tl.store(dg_ptrs, dgate.to(DGU.dtype.element_ty), mask=mask)
            tl.store(dg_ptrs + N_OUT * stride_dgn, dup.to(DGU.dtype.element_ty), mask=mask)


def _weight_grad_kernel(A, B, DW, A_IDX, B_IDX, SCALE, GROUP_OFFS, M_A, N_B,
                        stride_am, stride_ak, stride_bm, stride_bk, stride_de, stride_di, stride_dj,
                        A_GROUPED: tl.constexpr, B_GROUPED: tl.constexpr, HAS_SCALE: tl.constexpr,
                        UPCAST: tl.constexpr, IEEE: tl.constexpr,
                        BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr):
    e = tl.program_id(0)
    pid_i = tl.program_id(1)
    pid_j = tl.program_id(2)
    start = tl.load(GROUP_OFFS + e)
    end = tl.load(GROUP_OFFS + e + 1)
    i = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
    j = pid_j * BLOCK_J + tl.arange(0, BLOCK_J)
    mask_i = i < M_A
    mask_j = j < N_B
    r = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_I, BLOCK_J], dtype=tl.float32)
    for p0 in range(start, end, BLOCK_K):
        p = p0 + r
        mask_p = p < end
        if A_GROUPED:
            a_rows = p.to(tl.int64)
        else:
            a_rows = tl.load(A_IDX + p, mask=mask_p, other=0).to(tl.int64)
        if B_GROUPED:
            b_rows = p.to(tl.int64)
        else:
            b_rows = tl.load(B_IDX + p, mask=mask_p, other=0).to(tl.int64)
        a = tl.load(A + a_rows[:, None] * stride_am + i[None, :] * stride_ak,
                    mask=mask_p[:, None] & mask_i[None, :], other=0.0)  # [BLOCK_K, BLOCK_I]
        b = tl.load(B + b_rows[:, None] * stride_bm + j[None, :] * stride_bk,
                    mask=mask_p[:, None] & mask_j[None, :], other=0.0)  # [BLOCK_K, BLOCK_J]
        if HAS_SCALE:
            s = tl.load(SCALE + p, mask=mask_p, other=0.0).to(tl.float32)
            a = (a.to(tl.float32) * s[:, None]).to(A.dtype.element_ty)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if IEEE:
            acc += tl.dot(tl.trans(a), b, input_precision="ieee")
        else:
            acc = tl.dot(tl.trans(a), b, acc)
    tl.store(DW + e.to(tl.int64) * stride_de + i[:, None] * stride_di + j[None, :] * stride_dj,
             acc.to(DW.dtype.element_ty), mask=mask_i[:, None] & mask_j[None, :])


def _configs(rows, names):
    return [triton.Config(dict(zip(names, r[:-2])), num_warps=r[-2], num_stages=r[-1]) for r in rows]


# (BLOCK_N, BLOCK_K, warps, stages) with BLOCK_M = 128 rows; ScatterMoE/Triton-tutorial-like tiles.
_GEMM_ROWS = [(128, 32, 4, 4), (128, 64, 8, 3), (64, 64, 4, 4), (256, 32, 8, 3), (64, 32, 4, 5), (128, 128, 8, 3)]
# The fused SwiGLU kernels keep several [BLOCK_M, BLOCK_N] fp32 tiles live (two accumulators in the
# forward; g, gate, up, silu, ... in the backward's epilogue), so their tiles give each thread fewer
# elements: at most 128 x 64 over 8 warps (32 per thread and tile), or 128 x 128 over 16 warps in the
# forward. `python -m kernels.compile_check` (registers and spills from the sm_90 cubins) chose
# these: none spills, where 128 x 64 on 4 warps and 128 x 128 on 8 warps spilled up to 1.4 KB per
# thread in the backward, and 16 warps (128 registers each) spilled 832 B.
_SWIGLU_ROWS = [(64, 32, 8, 3), (64, 64, 8, 3), (32, 64, 4, 4), (32, 128, 4, 3), (128, 32, 16, 3), (128, 64, 16, 3)]
_SWIGLU_BWD_ROWS = [(64, 32, 8, 3), (64, 64, 8, 3), (64, 32, 8, 4), (64, 128, 8, 3), (32, 64, 4, 4)]
# (BLOCK_I, BLOCK_J, BLOCK_K, warps, stages)
_WGRAD_ROWS = [(128, 128, 32, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 64, 4, 4),
               (128, 128, 64, 8, 3)]
_MIN_SWIGLU_BLOCK_N = min(min(r[0] for r in _SWIGLU_BWD_ROWS), INTERPRET_GEMM["BLOCK_N"])


class _Kernel:
    """A kernel function, jit-compiled on first launch (again if TRITON_INTERPRET changed); on CUDA
    wrapped in `triton.autotune` unless the caller fixes the tile sizes."""

    def __init__(self, fn, rows, names, key, reset_to_zero=None):
        self.fn, self.rows, self.names, self.key, self.reset = fn, rows, names, key, reset_to_zero
        self._jit, self._tuned = {}, None

    def jitted(self):
        mode = _interpreting()
        if mode not in self._jit:
            self._jit[mode] = triton.jit(self.fn)
        return self._jit[mode]

    def launch(self, grid, args, meta: dict, tiles: Optional[dict], interpret_tiles: dict):
        """`grid(tiles) -> tuple`; `tiles` fixes the tuned meta-parameters (None: autotune on CUDA)."""
        if _interpreting() or tiles is not None:
            tiles = dict(interpret_tiles if tiles is None else tiles)
            self.jitted()[grid(tiles)](*args, **meta, **tiles)
            return
        if self._tuned is None:
            self._tuned = triton.autotune(configs=_configs(self.rows, self.names), key=self.key,
                                          reset_to_zero=self.reset)(self.jitted())
        self._tuned[lambda m: grid(m)](*args, **meta)


_gemm = _Kernel(_grouped_gemm_kernel, _GEMM_ROWS, ["BLOCK_N", "BLOCK_K"], ["N_OUT", "K_IN"])
_swiglu_fwd = _Kernel(_grouped_gemm_kernel, _SWIGLU_ROWS, ["BLOCK_N", "BLOCK_K"], ["N_OUT", "K_IN"])
_swiglu_bwd = _Kernel(_grouped_gemm_kernel, _SWIGLU_BWD_ROWS, ["BLOCK_N", "BLOCK_K"], ["N_OUT", "K_IN"],
                      reset_to_zero=["DWP"])
_wgrad = _Kernel(_weight_grad_kernel, _WGRAD_ROWS, ["BLOCK_I", "BLOCK_J", "BLOCK_K"], ["M_A", "N_B"])


def _dot_flags(dtype: torch.dtype) -> dict:
    """UPCAST: the interpreter's tl.dot is wrong for bf16, so 16-bit tiles are upcast there.
    IEEE: exact fp32 products for fp32 inputs unless torch allows TF32 matmuls."""
    return dict(UPCAST=_interpreting() and dtype != torch.float32,
                IEEE=dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32)


def _check_tiles(tiles: Optional[dict], names) -> None:
    if tiles is None:
        return
    for n in names:
        v = tiles.get(n)
        if v is None or v < 16 or v & (v - 1):
            _fail(f"tile {n}={v!r} must be a power of two >= 16 (tl.dot); got tiles {tiles}")


def _gemm_args(x, w, y, gu, dgu, dwp, routing, scale, n_out, k_in, w_strides):
    dummy = routing.sorted_assign
    return (x, w, y, dummy if gu is None else gu, dummy if dgu is None else dgu, dummy if dwp is None else dwp,
            routing.sorted_token, routing.sorted_assign, dummy if scale is None else scale,
            routing.block_group, routing.block_start, routing.group_offs,
            n_out, k_in, routing.n_experts,
            x.stride(0), x.stride(1), w.stride(0), w_strides[0], w_strides[1], y.stride(0), y.stride(1),
            gu.stride(0) if gu is not None else 0, gu.stride(1) if gu is not None else 0,
            dgu.stride(0) if dgu is not None else 0, dgu.stride(1) if dgu is not None else 0,
            dwp.stride(0) if dwp is not None else 0, dwp.stride(1) if dwp is not None else 0)


# ================================================================================ launchers

def grouped_gemm(x: torch.Tensor, w: torch.Tensor, routing: MoERouting, *, x_grouped: bool, y_grouped: bool,
                 trans_w: bool = True, scale: Optional[torch.Tensor] = None,
                 tiles: Optional[dict] = None) -> torch.Tensor:
    """`y[out(p)] = scale[p] * x[in(p)] @ (w[e]^T if trans_w else w[e])` -> `[N, out]` in x's dtype.

    x: `[N, in]` grouped (`x_grouped`) or `[T, in]` token rows (gathered by `sorted_token`);
    w: `[E, out, in]` (`trans_w`, nn.Linear layout) or `[E, in, out]`; scale: fp32 `[N]` in sorted
    order or None. The output is grouped (`y_grouped`) or in assignment order `t * K + k`; dropped
    assignments' rows are zero. `tiles={"BLOCK_N":..,"BLOCK_K":..}` fixes the tiles (else autotuned
    on CUDA, the interpreter config on CPU)."""
    what = "grouped_gemm"
    _check_act("x", x, routing.n_assign if x_grouped else routing.n_tokens, None, routing, what)
    _check_weight("w", w, routing, x.dtype, what)
    _check_scale(scale, routing, what)
    _check_tiles(tiles, ["BLOCK_N", "BLOCK_K"])
    k_in, n_out = (w.shape[2], w.shape[1]) if trans_w else (w.shape[1], w.shape[2])
    if x.shape[1] != k_in:
        _fail(f"{what}: x has {x.shape[1]} features but w{' (transposed)' if trans_w else ''} expects {k_in}")
    y = torch.empty(routing.n_assign, n_out, dtype=x.dtype, device=x.device)
    if routing.n_assign == 0 or n_out == 0:
        return y
    _check_launch(x)
    w_strides = (w.stride(2), w.stride(1)) if trans_w else (w.stride(1), w.stride(2))
    args = _gemm_args(x, w, y, None, None, None, routing, scale, n_out, k_in, w_strides)
    meta = dict(X_GROUPED=x_grouped, Y_GROUPED=y_grouped, HAS_SCALE=scale is not None, EPILOGUE=0,
                STORE_GU=False, BLOCK_M=routing.block_m, **_dot_flags(x.dtype))
    _gemm.launch(lambda m: (routing.max_blocks, triton.cdiv(n_out, m["BLOCK_N"])), args, meta, tiles,
                 INTERPRET_GEMM)
    return y


def gate_up_swiglu(x: torch.Tensor, gate_up: torch.Tensor, routing: MoERouting, *, x_grouped: bool = False,
                   store_gate_up: bool = True, tiles: Optional[dict] = None):
    """`(h [N, H], gu [N, 2H] or None)` grouped: `gu = x[in(p)] @ gate_up[e]^T` (gate rows, then up
    rows of `gate_up [E, 2H, D]`), `h = silu(gate) * up`; one fused kernel, x's dtype."""
    what = "gate_up_swiglu"
    _check_act("x", x, routing.n_assign if x_grouped else routing.n_tokens, None, routing, what)
    _check_weight("gate_up", gate_up, routing, x.dtype, what)
    _check_tiles(tiles, ["BLOCK_N", "BLOCK_K"])
    if gate_up.shape[1] % 2 or gate_up.shape[2] != x.shape[1]:
        _fail(f"{what}: gate_up must be [E, 2H, D={x.shape[1]}]; got {tuple(gate_up.shape)}")
    H, D = gate_up.shape[1] // 2, gate_up.shape[2]
    h = torch.empty(routing.n_assign, H, dtype=x.dtype, device=x.device)
    gu = torch.empty(routing.n_assign, 2 * H, dtype=x.dtype, device=x.device) if store_gate_up else None
    if routing.n_assign == 0 or H == 0:
        return h, gu
    _check_launch(x)
    args = _gemm_args(x, gate_up, h, gu, None, None, routing, None, H, D, (gate_up.stride(2), gate_up.stride(1)))
    meta = dict(X_GROUPED=x_grouped, Y_GROUPED=True, HAS_SCALE=False, EPILOGUE=1, STORE_GU=store_gate_up,
                BLOCK_M=routing.block_m, **_dot_flags(x.dtype))
    _swiglu_fwd.launch(lambda m: (routing.max_blocks, triton.cdiv(H, m["BLOCK_N"])), args, meta, tiles,
                       INTERPRET_GEMM)
    return h, gu


def swiglu_down_backward(dy: torch.Tensor, down: torch.Tensor, gu: torch.Tensor, w_sorted: torch.Tensor,
                         routing: MoERouting, *, tiles: Optional[dict] = None):
    """`(dgu [N, 2H], h [N, H], dw_sorted [N] fp32)` for `y[t] = sum_k w * (h @ down[e]^T)`:
    `g = dy[token(p)] @ down[e]` (input-gradient GEMM, dy gathered by token), then in the epilogue
    `h = silu(gate) * up` from `gu`, `dw = g . h` (per column tile, summed here), `dh = w * g` and
    the SwiGLU backward. `dy [T, D]`, `down [E, D, H]`, `gu [N, 2H]` grouped, `w_sorted` fp32 [N]."""
    what = "swiglu_down_backward"
    _check_act("dy", dy, routing.n_tokens, None, routing, what)
    _check_weight("down", down, routing, dy.dtype, what)
    _check_scale(w_sorted, routing, what)
    _check_tiles(tiles, ["BLOCK_N", "BLOCK_K"])
    D, H = down.shape[1], down.shape[2]
    if dy.shape[1] != D:
        _fail(f"{what}: dy has {dy.shape[1]} features but down is [E, D={D}, H={H}]")
    _check_act("gu", gu, routing.n_assign, 2 * H, routing, what)
    if gu.dtype != dy.dtype:
        _fail(f"{what}: gu dtype {gu.dtype} != dy dtype {dy.dtype}")
    N = routing.n_assign
    dgu = torch.empty(N, 2 * H, dtype=dy.dtype, device=dy.device)
    h = torch.empty(N, H, dtype=dy.dtype, device=dy.device)
    min_bn = tiles["BLOCK_N"] if tiles is not None else (
        INTERPRET_GEMM["BLOCK_N"] if _interpreting() else _MIN_SWIGLU_BLOCK_N)
    # one partial dot product per column tile; zeroed so the columns an autotuned config with wider
    # tiles leaves unwritten add nothing (the autotuner re-zeroes it between its trial runs)
    dwp = torch.zeros(N, max(1, triton.cdiv(H, min_bn) if triton else 1), dtype=torch.float32, device=dy.device)
    if N == 0 or H == 0:
        return dgu, h, dwp.sum(1)
    _check_launch(dy)
    args = _gemm_args(dy, down, h, gu, dgu, dwp, routing, w_sorted, H, D, (down.stride(1), down.stride(2)))
    meta = dict(X_GROUPED=False, Y_GROUPED=True, HAS_SCALE=True, EPILOGUE=2, STORE_GU=False,
                BLOCK_M=routing.block_m, **_dot_flags(dy.dtype))
    _swiglu_bwd.launch(lambda m: (routing.max_blocks, triton.cdiv(H, m["BLOCK_N"])), args, meta, tiles,
                       INTERPRET_GEMM)
    return dgu, h, dwp.sum(1)


def group_weight_grad(a: torch.Tensor, b: torch.Tensor, routing: MoERouting, *, a_grouped: bool, b_grouped: bool,
                      scale: Optional[torch.Tensor] = None, tiles: Optional[dict] = None) -> torch.Tensor:
    """`dW [E, a_cols, b_cols]`, `dW[e] = sum_{p in e} (scale[p] * a[row_a(p)])^T b[row_b(p)]` (rows
    grouped, or token rows gathered by `sorted_token`); experts without rows get zeros; a's dtype."""
    what = "group_weight_grad"
    _check_act("a", a, routing.n_assign if a_grouped else routing.n_tokens, None, routing, what)
    _check_act("b", b, routing.n_assign if b_grouped else routing.n_tokens, None, routing, what)
    if b.dtype != a.dtype:
        _fail(f"{what}: a dtype {a.dtype} != b dtype {b.dtype}")
    _check_scale(scale, routing, what)
    _check_tiles(tiles, ["BLOCK_I", "BLOCK_J", "BLOCK_K"])
    E, M, Nb = routing.n_experts, a.shape[1], b.shape[1]
    dw = torch.empty(E, M, Nb, dtype=a.dtype, device=a.device)
    if M == 0 or Nb == 0:
        return dw
    _check_launch(a)
    dummy = routing.sorted_assign
    args = (a, b, dw, routing.sorted_token, routing.sorted_token, dummy if scale is None else scale,
            routing.group_offs, M, Nb, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            dw.stride(0), dw.stride(1), dw.stride(2))
    meta = dict(A_GROUPED=a_grouped, B_GROUPED=b_grouped, HAS_SCALE=scale is not None, **_dot_flags(a.dtype))
    _wgrad.launch(lambda m: (E, triton.cdiv(M, m["BLOCK_I"]), triton.cdiv(Nb, m["BLOCK_J"])), args, meta,
                  tiles, INTERPRET_WGRAD)
    return dw


# ================================================================================ the MoE MLP

class MoEMLPFunction(torch.autograd.Function):
    """`y [T, D] = sum_k w[t, k] * SwiGLU-expert_{e[t, k]}(x[t])` from the Triton kernels, with a full
    backward through the same kernels (dx, d gate_up, d down and the router weights)."""

    @staticmethod
    def forward(ctx, x, weights_TK, gate_up, down, routing: MoERouting, tiles: Optional[dict] = None):
        T, K = routing.n_tokens, routing.top_k
        w_sorted = weights_TK.reshape(-1)[routing.sorted_assign.long()].float().contiguous()
        need_grad = any(ctx.needs_input_grad[:4])
        h, gu = gate_up_swiglu(x, gate_up, routing, store_gate_up=need_grad, tiles=tiles)
        y_NkD = grouped_gemm(h, down, routing, x_grouped=True, y_grouped=False, scale=w_sorted, tiles=tiles)
        y = y_NkD.view(T, K, y_NkD.shape[1]).sum(1)
        ctx.save_for_backward(x, gate_up, down, gu, w_sorted)
        ctx.routing, ctx.tiles, ctx.w_dtype = routing, tiles, weights_TK.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, gate_up, down, gu, w_sorted = ctx.saved_tensors
        routing, tiles = ctx.routing, ctx.tiles
        T, K = routing.n_tokens, routing.top_k
        wtiles = None if tiles is None else dict(BLOCK_I=tiles["BLOCK_N"], BLOCK_J=tiles["BLOCK_N"],
                                                 BLOCK_K=tiles["BLOCK_K"])
        dy = dy.to(x.dtype).contiguous()
        dgu, h, dw_sorted = swiglu_down_backward(dy, down, gu, w_sorted, routing, tiles=tiles)
        dx = dweights = dgate_up = ddown = None
        if ctx.needs_input_grad[0]:
            dx_NkD = grouped_gemm(dgu, gate_up, routing, x_grouped=True, y_grouped=False, trans_w=False, tiles=tiles)
            dx = dx_NkD.view(T, K, dx_NkD.shape[1]).sum(1)
        if ctx.needs_input_grad[1]:
            dweights = torch.empty_like(dw_sorted).scatter_(0, routing.sorted_assign.long(), dw_sorted)
            dweights = dweights.view(T, K).to(ctx.w_dtype)
        if ctx.needs_input_grad[2]:
            dgate_up = group_weight_grad(dgu, x, routing, a_grouped=True, b_grouped=False, tiles=wtiles)
        if ctx.needs_input_grad[3]:
            ddown = group_weight_grad(dy, h, routing, a_grouped=False, b_grouped=True, scale=w_sorted, tiles=wtiles)
        return dx, dweights, dgate_up, ddown, None, None


def moe_mlp(x_TD: torch.Tensor, experts_TK: torch.Tensor, weights_TK: torch.Tensor, gate_up_E2HD: torch.Tensor,
            down_EDH: torch.Tensor, *, block_m: Optional[int] = None, tiles: Optional[dict] = None) -> torch.Tensor:
    """The expert MLP of an MoE layer with the Triton kernels (differentiable in x, the router
    weights and both expert weight tensors). x and the weights must share a dtype (fp32/fp16/bf16);
    the router weights may be any float dtype (they are used in fp32). Returns `[T, D]` in x's dtype.
    `tiles={"BLOCK_N", "BLOCK_K"}` fixes every kernel's tiles (tests); default: autotuned on CUDA."""
    reason = runnable_reason(x_TD.device)
    if reason is not None:
        raise RuntimeError(reason)
    if x_TD.dim() != 2:
        _fail(f"moe_mlp: x must be [tokens, d_model]; got shape {tuple(x_TD.shape)}")
    if experts_TK.shape[0] != x_TD.shape[0] or weights_TK.shape != experts_TK.shape:
        _fail(f"moe_mlp: experts {tuple(experts_TK.shape)} and weights {tuple(weights_TK.shape)} must both be "
              f"[tokens={x_TD.shape[0]}, top_k]")
    if not weights_TK.is_floating_point():
        _fail(f"moe_mlp: router weights must be floating point; got {weights_TK.dtype}")
    for name, t in (("experts", experts_TK), ("weights", weights_TK), ("gate_up", gate_up_E2HD), ("down", down_EDH)):
        if t.device != x_TD.device:
            _fail(f"moe_mlp: x is on {x_TD.device} but {name} on {t.device}")
    E = gate_up_E2HD.shape[0]
    if down_EDH.dim() != 3 or down_EDH.shape[0] != E or down_EDH.shape[1] != x_TD.shape[1] \
            or gate_up_E2HD.dim() != 3 or gate_up_E2HD.shape[1] != 2 * down_EDH.shape[2]:
        _fail(f"moe_mlp: need gate_up [E, 2H, D] and down [E, D, H] with D={x_TD.shape[1]}; got "
              f"{tuple(gate_up_E2HD.shape)} and {tuple(down_EDH.shape)}")
    routing = moe_routing(experts_TK, E, block_m)
    return MoEMLPFunction.apply(x_TD.contiguous(), weights_TK, gate_up_E2HD.contiguous(), down_EDH.contiguous(),
                                routing, tiles)


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


__all__ = ["MoERouting", "moe_routing", "grouped_gemm", "gate_up_swiglu", "swiglu_down_backward",
           "group_weight_grad", "moe_mlp", "MoEMLPFunction", "runnable_reason", "grouped_gemm_reference",
           "gate_up_swiglu_reference", "swiglu_down_backward_reference", "group_weight_grad_reference",
           "moe_mlp_reference"]
