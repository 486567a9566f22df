"""`torch.autograd.gradcheck` in float64 on tiny shapes for the expert dispatches, including the
custom autograd Function of `sorted_fused` (its hand-written backward: d x, d combine weights,
d gate_up, d down). Finite differences are the
reference: no other implementation is trusted. The selection has a dropped assignment (sentinel
id E) and an expert that gets no token, the two places a hand-written backward goes wrong."""

import pytest
import torch

from moe.experts import EXPERT_DISPATCH

T, D, H, E = 5, 4, 3, 4


def inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, D, dtype=torch.float64, generator=g)
    experts = torch.tensor([[0, 1], [1, E], [0, 2], [2, 1], [1, 0]])  # expert 3 unused; one dropped slot
    weights = torch.rand(T, 2, dtype=torch.float64, generator=g).masked_fill(experts == E, 0.0)
    gate_up = torch.randn(E, 2 * H, D, dtype=torch.float64, generator=g) * 0.5
    down = torch.randn(E, D, H, dtype=torch.float64, generator=g) * 0.5
    return x, experts, weights, gate_up, down


def gradcheck_dispatch(name):
    fn = EXPERT_DISPATCH.get(name)
    x, experts, weights, gate_up, down = inputs()
    leaves = [t.requires_grad_(True) for t in (x, weights, gate_up, down)]
    assert torch.autograd.gradcheck(lambda a, w, gu, dn: fn(a, experts, w, gu, dn), leaves)


@pytest.mark.parametrize("name", ["loop", "sorted", "sorted_fused"])
def test_dispatch_gradcheck_float64(name):
    gradcheck_dispatch(name)


# The Triton dispatch has no float64 kernels (fp32/fp16/bf16 only), so gradcheck cannot run on it;
# tests/experts/test_triton_mlp.py compares its gradients with the loop dispatch's in float32.
