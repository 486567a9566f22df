import math

import pytest
import torch

from moe.config import ModelConfig
from moe.routing.routers import router_config
from moe.errors import ConfigError
from moe.model import Rotary, Transformer, apply_rotary
from moe.attention import ATTENTION_BACKENDS
from tests.conftest import tiny_model_config, with_variants


def test_gqa_equals_mha_when_kv_heads_equal_heads():
    """With n_kv_heads == n_heads, GQA must be plain multi-head attention; and GQA with
    grouped heads must equal MHA with each kv head repeated."""
    B, H, T, d = 2, 4, 7, 8
    q = torch.randn(B, H, T, d)
    k, v = torch.randn(B, H, T, d), torch.randn(B, H, T, d)
    for name in ("eager", "sdpa"):  # flash needs CUDA + flash-attn (tests/attention/test_flash.py)
        out = ATTENTION_BACKENDS.get(name)()(q, k, v)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        ref = torch.softmax(scores, -1) @ v
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    k2, v2 = torch.randn(B, 2, T, d), torch.randn(B, 2, T, d)
    for name in ("eager", "sdpa"):  # flash needs CUDA + flash-attn (tests/attention/test_flash.py)
        out = ATTENTION_BACKENDS.get(name)()(q, k2, v2)
        ref = ATTENTION_BACKENDS.get("eager")()(q, k2.repeat_interleave(2, 1), v2.repeat_interleave(2, 1))
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_rope_depends_only_on_relative_position():
    rot = Rotary(ModelConfig(d_model=16, n_heads=1, n_kv_heads=1, max_seq_len=128, rope_theta=10000.0))
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(pq, pk):
        cq, sq = rot(torch.tensor([[pq]]))
        ck, sk = rot(torch.tensor([[pk]]))
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum()

    base = score(5, 2)
    for shift in (1, 7, 30, 100):
        torch.testing.assert_close(score(5 + shift, 2 + shift), base, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(score(5, 2), score(5, 3))


def test_rope_is_a_rotation():
    rot = Rotary(ModelConfig(d_model=8, n_heads=1, n_kv_heads=1, max_seq_len=32, rope_theta=10000.0))
    x = torch.randn(2, 3, 10, 8)
    cos, sin = rot(torch.arange(10).expand(2, 10))
    torch.testing.assert_close(apply_rotary(x, cos, sin).norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("kw", [dict(), dict(n_shared_experts=1), dict(n_dense_layers=1), dict(tie_embeddings=True),
                                dict(n_kv_heads=4), dict(n_kv_heads=1)])
def test_variants_agree_with_references(kw):
    """The fast paths (sdpa + sorted dispatch) equal the references (eager + loop)."""
    cfg = tiny_model_config(**kw)
    r = router_config(top_k=2)
    fast = Transformer(with_variants(cfg, r, "sdpa", "sorted"))
    ref = Transformer(with_variants(cfg, r, "eager", "loop"))
    ref.load_state_dict(fast.state_dict())
    x = torch.randint(0, cfg.vocab_size, (3, 11))
    a, b = fast(x, labels=x), ref(x, labels=x)
    torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
    a.loss.backward()
    b.loss.backward()
    for (n, p), (_, q) in zip(fast.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=n)


def test_loss_includes_router_losses_whenever_coefficients_are_nonzero():
    cfg = tiny_model_config()
    x = torch.randint(0, cfg.vocab_size, (2, 9))
    for mode in ("train", "eval"):
        m = Transformer(with_variants(cfg, router_config(top_k=2, aux_loss_coef=0.5, z_loss_coef=0.1)))
        m.train(mode == "train")
        out = m(x, labels=x)
        expected = sum(0.5 * float(r.aux_loss) + 0.1 * float(r.z_loss) for r in out.moe_records)
        assert expected > 0
        assert float(out.loss - out.lm_loss) == pytest.approx(expected, rel=1e-5)
    m = Transformer(with_variants(cfg, router_config(top_k=2, aux_loss_coef=0.0, z_loss_coef=0.0)))
    out = m(x, labels=x)
    assert float(out.loss) == pytest.approx(float(out.lm_loss))


def test_labels_and_targets_conventions_agree():
    cfg = tiny_model_config()
    m = Transformer(with_variants(cfg, router_config()))
    x = torch.randint(0, cfg.vocab_size, (2, 10))
    a = m(x, labels=x).lm_loss
    b = m(x[:, :-1], targets=x[:, 1:]).lm_loss
    # Same next-token pairs; the last position of `x` has no target in the labels form.
    manual = torch.nn.functional.cross_entropy(m(x).logits[:, :-1].reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1))
    torch.testing.assert_close(a, manual)
    torch.testing.assert_close(b, manual)


def test_num_params_active_and_flops():
    cfg = tiny_model_config(n_experts=8)
    m = Transformer(with_variants(cfg, router_config(top_k=2)))
    per_expert = 3 * cfg.d_model * cfg.expert_hidden
    assert m.num_params() - m.num_params(active=True) == cfg.n_layers * 6 * per_expert
    assert m.num_params(embedding=False) == m.num_params() - cfg.vocab_size * cfg.d_model
    f = m.flops_per_token(seq_len=16)
    assert f == 6 * m.num_params(active=True, embedding=False) + 12 * cfg.n_layers * cfg.d_model * 16
    assert m.estimate_mfu(1000.0, 16, peak_flops=f * 2000.0) == pytest.approx(0.5)


@pytest.mark.parametrize("kw,field", [
    (dict(n_heads=4, n_kv_heads=3), "n_kv_heads"),
    (dict(d_model=0), "model.d_model"),
    (dict(n_dense_layers=9), "model.n_dense_layers"),
])
def test_bad_model_config_is_a_clear_error(kw, field):
    with pytest.raises(ConfigError, match=field):
        Transformer(with_variants(tiny_model_config(**kw), router_config()))


def test_top_k_larger_than_n_experts_is_an_error():
    with pytest.raises(ConfigError, match=r"router.top_k=5 must be <= model.n_experts=4"):
        Transformer(with_variants(tiny_model_config(), router_config(top_k=5)))


# ------------------------------------------------------------------ routing ablations (set_routing)

def test_set_routing_changes_the_loaded_model_in_place():
    torch.manual_seed(0)
    model = Transformer(with_variants(tiny_model_config(n_experts=6), router_config(top_k=2))).eval()
    weights = {n: p for n, p in model.named_parameters()}
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        base = model(ids).logits
    active2 = model.num_params(active=True)
    model.set_routing(top_k=3, drop_experts=[0, 5], renormalize=False)
    assert model.cfg.router.top_k == 3 and model.cfg.router.drop_experts == [0, 5]
    assert all(p is weights[n] for n, p in model.named_parameters())  # no copy, same Parameters
    out = model(ids)
    assert all(r.counts_E[[0, 5]].sum() == 0 and r.counts_E.sum() == 3 * 22 for r in out.moe_records)
    assert model.num_params(active=True) > active2
    assert not torch.allclose(out.logits, base)
    model.set_routing(top_k=2, drop_experts=[], renormalize=True)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, base, atol=0, rtol=0)

@pytest.mark.parametrize("change, match", [
    (dict(top_k=5, drop_experts=[0, 1]), r"router.top_k=5 must be <= the 4 experts left after router.drop_experts"),
    (dict(drop_experts=[6]), r"router.drop_experts=\[6\] must hold distinct indices in \[0, model.n_experts=6\)"),
    (dict(drop_experts=[1, 1]), "must hold distinct indices"),
    (dict(top_k=0), "router.top_k=0 must be > 0"),
])
def test_bad_routing_is_refused_by_name(change, match):
    model = Transformer(with_variants(tiny_model_config(n_experts=6), router_config(top_k=2)))
    with pytest.raises(ConfigError, match=match):
        model.set_routing(**change)
    assert model.cfg.router.top_k == 2 and model.cfg.router.drop_experts == []

def test_hash_routing_cannot_drop_or_resize():
    model = Transformer(with_variants(tiny_model_config(), router_config(name="hash", top_k=2)))
    with pytest.raises(ConfigError, match="hash routing has a fixed token -> experts table"):
        model.set_routing(drop_experts=[0])
    with pytest.raises(ConfigError, match="buffer 'table' depends on them"):
        model.set_routing(top_k=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_apply_rotary_keeps_dtype_and_wide_math(dtype):
    """fp32/fp64 rotate in their own precision with no casts; 16-bit inputs in fp32, rounded once."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 5, 8, generator=g).to(dtype)
    cos, sin = torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)
    x1, x2 = x.double().chunk(2, dim=-1)
    want = x.double() * cos.double()[:, None] + torch.cat([-x2, x1], -1) * sin.double()[:, None]
    got = apply_rotary(x, cos, sin)
    assert got.dtype == dtype
    wide = torch.promote_types(dtype, torch.float32)
    xw = x.to(wide)
    exact = (xw * cos[:, None] + torch.cat([-xw.chunk(2, -1)[1], xw.chunk(2, -1)[0]], -1) * sin[:, None]).to(dtype)
    assert torch.equal(got, exact)
    torch.testing.assert_close(got.double(), want, rtol=1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-6,
                               atol=1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-6)


@pytest.mark.parametrize("B,T", [(1, 1), (3, 5)])
def test_attention_rotates_q_and_k_packed_exactly_as_one_by_one(B, T):
    # without qk-norm or clipping the layer rotates q and k as one packed tensor; every value (and gradient)
    # must be what rotating each of them separately gives
    import torch.nn.functional as F
    from moe.model import Attention
    cfg = tiny_model_config(n_heads=4, n_kv_heads=2)
    torch.manual_seed(0)
    layer = Attention(cfg, 0)
    H, G, d = layer.n_heads, layer.n_kv_heads, layer.head_dim
    x = torch.randn(B, T, cfg.d_model, requires_grad=True)
    cos, sin = Rotary(cfg)(torch.arange(T).expand(B, T))
    got = layer(x, cos, sin)
    q, k, v = layer.qkv_proj(x).split([H * d, G * d, G * d], dim=-1)
    q = apply_rotary(q.view(B, T, H, d).transpose(1, 2).contiguous(), cos, sin)
    k = apply_rotary(k.view(B, T, G, d).transpose(1, 2).contiguous(), cos, sin)
    o = F.scaled_dot_product_attention(q, k, v.view(B, T, G, d).transpose(1, 2), is_causal=True, enable_gqa=True)
    want = layer.o_proj(o.transpose(1, 2).reshape(B, T, H * d))
    assert torch.allclose(got, want, atol=1e-6, rtol=0)
    g_got = torch.autograd.grad(got.square().sum(), x)[0]
    g_want = torch.autograd.grad(want.square().sum(), x)[0]
    assert torch.allclose(g_got, g_want, atol=1e-5, rtol=0)
