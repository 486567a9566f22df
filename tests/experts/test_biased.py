"""`BiasedExperts` (expert biases, clamped SwiGLU): loop and sorted equal transformers'
`GptOssExperts` on the same weights (gradients too for the two of ours), and the dispatches
without a bias / activation path are refused."""

import pytest
import torch

from moe.errors import ConfigError
from moe.experts import BiasedExperts
from moe.hf.families.gpt_oss import TRANSFORMS

E, D, H, T, K = 4, 16, 8, 11, 2


def _experts(dispatch, activation="clamped_swiglu", bias=True):
    torch.manual_seed(0)
    ex = BiasedExperts(E, D, H, dispatch, activation=activation, alpha=1.702, limit=0.7, bias=bias)
    with torch.no_grad():
        for p in ex.parameters():
            p.normal_()
    return ex


def _routing():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, D, generator=g)
    experts = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    return x, experts, torch.rand(T, K, generator=g)


def test_equals_transformers_gpt_oss_experts():
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    from transformers import GptOssConfig
    ours = _experts("sorted")
    theirs = gpt_oss.GptOssExperts(GptOssConfig(num_local_experts=E, hidden_size=D, intermediate_size=H,
                                                swiglu_limit=0.7))
    with torch.no_grad():
        for name in ("gate_up_proj", "gate_up_proj_bias", "down_proj"):
            getattr(theirs, name).copy_(TRANSFORMS[f"experts.{name}"][1](getattr(ours, name)))
        theirs.down_proj_bias.copy_(ours.down_proj_bias)
    x, experts, weights = _routing()
    with torch.no_grad():
        torch.testing.assert_close(ours(x, experts, weights), theirs(x, experts, weights), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("activation,bias", [("clamped_swiglu", True), ("swiglu", True), ("clamped_swiglu", False)])
def test_sorted_equals_loop_with_gradients(activation, bias):
    x, experts, weights = _routing()
    outs, grads = [], []
    for dispatch in ("loop", "sorted"):
        ex = _experts(dispatch, activation, bias)
        xi = x.clone().requires_grad_()
        y = ex(xi, experts, weights)
        y.square().sum().backward()
        outs.append(y.detach())
        grads.append([xi.grad] + [p.grad for p in ex.parameters()])
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_dispatches_without_a_bias_path_are_refused():
    with pytest.raises(ConfigError, match="experts.name='triton'.*model.expert_bias"):
        BiasedExperts(E, D, H, "triton", bias=True)


def test_clamped_swiglu_rows_do_not_depend_on_the_batch():
    # the expert cache computes a forward's rows in chunks and must equal the resident layer: a
    # row's activation may not change with how many rows share the call (CPU vector tails)
    from moe.experts.biased import clamped_swiglu, row_local_sigmoid
    g = torch.Generator().manual_seed(0)
    gate, up = torch.randn(7, 12, generator=g) * 3, torch.randn(7, 12, generator=g) * 3
    full = clamped_swiglu(gate, up, 1.702, 7.0)
    for n in (1, 2, 3, 5):
        assert torch.equal(clamped_swiglu(gate[:n], up[:n], 1.702, 7.0), full[:n])
    z = gate * 1.702
    assert torch.allclose(row_local_sigmoid(z), torch.sigmoid(z), rtol=1e-6, atol=1e-7)
    z.requires_grad_(True)
    row_local_sigmoid(z).sum().backward()  # autograd takes torch.sigmoid
    assert torch.allclose(z.grad, torch.sigmoid(z) * (1 - torch.sigmoid(z)))
