"""Shared inputs of the MoE kernel tests (tests/kernels/test_moe_gemm_*.py) and of the `triton`
expert dispatch tests (tests/experts/test_triton*.py).

The kernels run in the Triton interpreter (set below, before the first launch; an explicit
TRITON_INTERPRET=0 in the environment is respected, e.g. to test the compiled kernels on a GPU).
Odd sizes throughout: token counts that are not a multiple of the row block, experts with no
tokens, dropped assignments (expert id == n_experts), top_k 1..4, D/H not multiples of 16, and
16-wide tiles so every loop runs over several tiles.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from kernels.runtime import interpreting  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
SMALL = dict(BLOCK_N=16, BLOCK_K=16)  # several tiles per loop at the test sizes
SMALL_W = dict(BLOCK_I=16, BLOCK_J=16, BLOCK_K=16)


def routing_case(T, E, K, drop=True, empty_expert=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(T, E, generator=g)
    if empty_expert and E > K:
        scores[:, 0] = -1e9  # expert 0 gets no tokens
    experts = scores.topk(K, dim=-1).indices
    weights = torch.rand(T, K, generator=g)
    if drop:
        mask = torch.rand(T, K, generator=g) < 0.3
        experts = experts.masked_fill(mask, E)
        weights = weights.masked_fill(mask, 0.0)
    return experts.to(DEVICE), weights.to(DEVICE)


def rand(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape) * scale).to(DEVICE, dtype)


def tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)


def mlp_case(T, D, H, E, K, drop, dtype):
    experts, weights = routing_case(T, E, K, drop=drop)
    x = rand(T, D, dtype=dtype)
    gate_up = rand(E, 2 * H, D, dtype=dtype, scale=D ** -0.5)
    down = rand(E, D, H, dtype=dtype, scale=H ** -0.5)
    return x, experts, weights, gate_up, down


def fwd_bwd(fn, inputs, gy=None):
    """(y, gy, [dx, d router weights, d gate_up, d down]) of `fn(*inputs)` for output gradient gy."""
    leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    y = fn(*leaves)
    if gy is None:
        gy = torch.randn_like(y)
    y.backward(gy)
    return y, gy, [leaves[i].grad for i in (0, 2, 3, 4)]


def upcast(inputs):
    return [t.float() if t.is_floating_point() else t for t in inputs]
