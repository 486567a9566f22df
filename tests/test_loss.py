"""The fused LM-head cross-entropy equals the plain one: loss and gradients."""

import pytest
import torch
import torch.nn.functional as F

from moe.loss import linear_cross_entropy
from moe.routing.routers import router_config
from moe.model import Transformer
from tests.conftest import tiny_model_config, with_variants


@pytest.mark.parametrize("N,D,V,chunk", [(1, 3, 5, 512), (37, 16, 101, 8), (64, 32, 257, 64), (100, 7, 33, 1000)])
def test_matches_plain_cross_entropy(N, D, V, chunk):
    h = torch.randn(N, D, requires_grad=True)
    w = torch.randn(V, D, requires_grad=True)
    t = torch.randint(0, V, (N,))
    t[torch.rand(N) < 0.2] = -100
    t[0] = 1  # at least one valid target
    ref = F.cross_entropy(h @ w.T, t, ignore_index=-100)
    ref.backward(torch.tensor(1.7))
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    out = linear_cross_entropy(h, w, t, chunk=chunk)
    out.backward(torch.tensor(1.7))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h.grad, gh, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(w.grad, gw, atol=1e-5, rtol=1e-4)


def test_all_ignored_gives_zero_and_no_grad_mode_works():
    h, w = torch.randn(4, 3, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    assert float(linear_cross_entropy(h, w, torch.full((4,), -100))) == 0.0
    with torch.no_grad():
        t = torch.randint(0, 5, (4,))
        torch.testing.assert_close(linear_cross_entropy(h, w, t), F.cross_entropy(h @ w.T, t))


@pytest.mark.parametrize("tie", [False, True])
def test_model_fused_path_equals_logits_path(tie):
    cfg = tiny_model_config(tie_embeddings=tie)
    m = Transformer(with_variants(cfg, router_config()))
    x = torch.randint(0, cfg.vocab_size, (3, 13))
    a = m(x, labels=x)
    a.loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    b = m(x, labels=x, return_logits=False)
    assert b.logits is None
    b.loss.backward()
    torch.testing.assert_close(a.loss, b.loss, atol=1e-5, rtol=1e-5)
    for n, p in m.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], atol=1e-5, rtol=1e-4, msg=n)


def test_bf16_autocast_close_to_fp32():
    h, w = torch.randn(50, 16), torch.randn(40, 16)
    t = torch.randint(0, 40, (50,))
    ref = F.cross_entropy(h @ w.T, t)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = linear_cross_entropy(h, w, t)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=5e-2, rtol=2e-2)


def test_fused_cross_entropy_gradcheck_float64():
    """The hand-written backward (softmax - one_hot, scaled per valid token) against finite
    differences, with chunks that split the tokens unevenly and ignored targets. The function
    computes in fp32 whatever its input dtype (documented: "fp32 math"), so the finite differences
    need a large step (eps 1e-2, central: O(eps^2) error) and a matching tolerance; a wrong sign,
    scale or missing ignore mask is off by far more."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(7, 5, dtype=torch.float64, generator=g).requires_grad_(True)
    w = torch.randn(11, 5, dtype=torch.float64, generator=g).requires_grad_(True)
    targets = torch.tensor([3, -100, 0, 10, 4, -100, 7])
    assert torch.autograd.gradcheck(lambda a, b: linear_cross_entropy(a, b, targets, chunk=3), (h, w),
                                    eps=1e-2, atol=2e-3, rtol=1e-2)


@pytest.mark.parametrize("frozen", ["w", "h"])
def test_gradient_when_only_one_input_requires_it(frozen):
    """A frozen LM head (or frozen hidden states) still gets the other gradient: the fused
    forward must compute gradients when EITHER input needs one (mutants: `and`, or the wrong
    `needs_input_grad` index, leave nothing saved for backward)."""
    g = torch.Generator().manual_seed(1)
    h = torch.randn(6, 4, generator=g, requires_grad=frozen == "w")
    w = torch.randn(9, 4, generator=g, requires_grad=frozen == "h")
    targets = torch.tensor([1, 8, -100, 0, 3, 3])
    linear_cross_entropy(h, w, targets, chunk=4).backward()
    h2, w2 = h.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    F.cross_entropy(h2 @ w2.T, targets).backward()
    live, ref = (h, h2) if frozen == "w" else (w, w2)
    torch.testing.assert_close(live.grad, ref.grad)


def test_autocast_matmuls_run_in_the_autocast_dtype():
    """Under autocast the fused loss equals nn.Linear's bf16 logits + an fp32 cross-entropy
    (exactly here), not the fp32 loss: a fused path that ignored autocast (mutant: compute in
    the input dtype) would be off by ~4e-3 on this example."""
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(64, 32, generator=g), torch.randn(100, 32, generator=g)
    t = torch.randint(0, 100, (64,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = linear_cross_entropy(h, w, t, chunk=16)
        plain = F.cross_entropy(F.linear(h, w).float(), t)
    fp32 = F.cross_entropy(h @ w.T, t)
    assert abs(float(fp32 - plain)) > 1e-3  # the example separates the two dtypes
    torch.testing.assert_close(fused, plain, atol=1e-5, rtol=0)
