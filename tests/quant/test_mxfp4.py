"""The `mxfp4` scheme (moe/quant/schemes/mxfp4.py): quantization against a per-element loop written
here from the OCP MX spec (shared exponent floor(log2 amax) - 2, nearest e2m1 value with ties to the
even mantissa, saturation at 6), dequantization against moe/hf/mxfp4.py's independent dequantiser,
its options, a whole model (experts only by default), `python -m moe.quantize --scheme mxfp4`, and
the quantized modules on the MXFP4 kernels (interpreter) against the dequantise path, GPT-OSS's
biased clamped-SwiGLU experts included."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.runtime import interpreting
from moe.config import ModelConfig
from moe.errors import ConfigError
from moe.hf.mxfp4 import dequantize_mxfp4 as hf_dequantize
from moe.loading import load_model, read_any_checkpoint
from moe.model import Transformer
from moe.quant import QuantExperts, QuantLinear, QuantSpec, get_scheme, quantize_model
from moe.quant.dispatch import kernel_mode
from moe.quantize import main
from moe.routing.routers import router_config
from tests.hf_fixtures import family_checkpoint, randomize_

MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # e2m1 codes 0..7; bit 3 is the sign
DEVICE = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"


def _code_by_hand(v: float) -> int:
    """The e2m1 code nearest v (ties: the even code, i.e. mantissa bit 0), saturating at +-6."""
    a = min(abs(v), 6.0)
    best = min(range(8), key=lambda c: (abs(MAGNITUDES[c] - a), c % 2))
    return best | (8 if math.copysign(1.0, v) < 0 else 0)


def _quantize_by_hand(w: torch.Tensor) -> tuple[list, list]:
    """(codes, exponents) of a 2-D w, row by row and block of 32 by block, the last block zero-padded."""
    codes, exps = [], []
    for row in w.tolist():
        row = row + [0.0] * (-len(row) % 32)
        row_codes, row_exps = [], []
        for g in range(0, len(row), 32):
            block = row[g:g + 32]
            amax = max(abs(v) for v in block)
            e = max(-127, math.floor(math.log2(amax)) - 2) if amax > 0 else -127
            row_exps.append(e + 127)
            row_codes += [_code_by_hand(v / 2.0 ** e) for v in block]
        codes.append(row_codes)
        exps.append(row_exps)
    return codes, exps


def test_quantize_equals_the_ocp_rule_by_hand():
    w = torch.randn(5, 70) * torch.logspace(-3, 2, 5).unsqueeze(-1)  # rows of very different scales; short block
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.25, -2.5, -5.0, -6.5, 0.1, 6.0])  # amax 7: e=0
    w[0, :14] = ties
    w[0, 14:32] = 0.0
    w[1, 32:64] = 0.0  # an all-zero block
    q = get_scheme("mxfp4").quantize(w)
    codes = torch.stack([q["blocks"] & 0xF, q["blocks"] >> 4], -1).flatten(-3)
    want_codes, want_exps = _quantize_by_hand(w)
    assert q["blocks"].shape == (5, 3, 16) and q["scales"].shape == (5, 3)
    assert codes.tolist() == want_codes and q["scales"].tolist() == want_exps
    assert codes[0, :14].tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 8, 12, 14, 15, 0, 7]  # ties to even, saturation


def test_dequantize_equals_the_independent_dequantiser_and_round_trips():
    g = torch.Generator().manual_seed(1)
    blocks = torch.randint(0, 256, (3, 7, 4, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 200, (3, 7, 4), dtype=torch.uint8, generator=g)  # 0: 2^-127, an fp32 subnormal
    scheme = get_scheme("mxfp4")
    got = scheme.dequantize({"blocks": blocks, "scales": scales}, 120, torch.float32)
    assert torch.equal(got, hf_dequantize(blocks, scales)[..., :120])
    w = torch.randn(2, 9, 45)
    once = scheme.fake_quantize(w)
    assert torch.equal(scheme.fake_quantize(once), once)  # MXFP4 values are fixed points of quantization
    assert float((once - w).abs().max()) <= float(w.abs().max()) / 4  # half a step at the top binade, at most


def test_options_the_scheme_lacks_are_refused_naming_both():
    for option in ("group_size", "calib_path"):
        with pytest.raises(ConfigError, match=rf"^quant.{option}: not an option of quantization='mxfp4'; "
                                              r"its options are \['linear'\]$"):
            QuantSpec("mxfp4", **{option: 32})
    with pytest.raises(ConfigError, match=r"^bad value for quant.linear \(quantization='mxfp4'\)"):
        QuantSpec("mxfp4", linear="maybe")


def _tiny(expert_bias: bool = False) -> Transformer:
    extra = dict(expert_bias=True, expert_activation="clamped_swiglu", swiglu_alpha=1.702, swiglu_limit=0.9,
                 router_bias=True, attention_sinks=True) if expert_bias else {}
    model = Transformer(ModelConfig(vocab_size=64, d_model=48, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4,
                                    expert_hidden=40, max_seq_len=32, router=router_config("topk", top_k=2), **extra))
    randomize_(model, 2)
    return model.eval()


# plain experts with the linears; GPT-OSS-style biased clamped-SwiGLU experts alone
@pytest.mark.parametrize("linear,expert_bias", [(True, False), (False, True)])
def test_a_model_computes_with_its_fake_quantized_weights(linear, expert_bias):
    model, scheme = _tiny(expert_bias), get_scheme("mxfp4")
    ref = _tiny(expert_bias)
    with torch.no_grad():  # the reference: float modules holding quantize-dequantized weights
        for block in ref.layers:
            block.ffn.experts.gate_up_proj.copy_(scheme.fake_quantize(block.ffn.experts.gate_up_proj))
            block.ffn.experts.down_proj.copy_(scheme.fake_quantize(block.ffn.experts.down_proj))
            for lin in (block.attn.qkv_proj, block.attn.o_proj) if linear else ():
                lin.weight.copy_(scheme.fake_quantize(lin.weight))
    quantize_model(model, {"scheme": "mxfp4", "linear": linear})
    assert isinstance(model.layers[0].ffn.experts, QuantExperts)
    assert isinstance(model.layers[0].attn.qkv_proj, QuantLinear) == linear
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, atol=1e-5, rtol=1e-5)


def test_quantize_cli_writes_an_mxfp4_checkpoint(tmp_path_factory, bpe_tokenizer, tmp_path):
    ckpt = family_checkpoint(tmp_path_factory.mktemp("mx"), bpe_tokenizer, d_model=64, n_heads=4, n_kv_heads=4)
    out = tmp_path / "mx.pt"
    assert main([str(ckpt), str(out), "--scheme", "mxfp4"]) == 0
    assert read_any_checkpoint(out)["quantization"] == {"scheme": "mxfp4", "linear": False}
    model, _, _ = load_model(out)
    direct, _, _ = load_model(ckpt, quantization="mxfp4")
    ids = torch.tensor([[5, 9, 3, 17, 22, 8, 1, 40]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, direct(ids).logits)  # saved == in memory
    assert torch.equal(model.layers[0].ffn.experts.gate_up_blocks, direct.layers[0].ffn.experts.gate_up_blocks)
    assert main([str(ckpt), str(tmp_path / "x.pt"), "--scheme", "mxfp4", "--group-size", "32"]) == 2


@pytest.mark.parametrize("biased", [False, True])
def test_the_modules_on_the_mxfp4_kernels_equal_the_dequantise_path(biased):
    g = torch.Generator().manual_seed(3)
    E, D, H, T, K = 4, 40, 24, 13, 2
    extra = dict(gate_up_bias_E2H=torch.randn(E, 2 * H, generator=g), down_bias_ED=torch.randn(E, D, generator=g),
                 activation="clamped_swiglu", alpha=1.702, limit=0.7) if biased else {}
    mod = QuantExperts(get_scheme("mxfp4"), torch.randn(E, 2 * H, D, generator=g) * 0.2,
                       torch.randn(E, D, H, generator=g) * 0.2, **extra).to(DEVICE)
    lin = QuantLinear(get_scheme("mxfp4"), torch.randn(21, 45, generator=g), torch.randn(21, generator=g)).to(DEVICE)
    x = torch.randn(T, D, generator=g).to(DEVICE)
    experts = torch.randint(0, E + 1, (T, K), generator=g).to(DEVICE)  # id E: a dropped assignment
    experts[0] = E  # a token with every assignment dropped
    weights = torch.rand(T, K, generator=g).to(DEVICE)
    xl = torch.randn(2, 3, 45, generator=g).to(DEVICE)
    with torch.no_grad():
        with kernel_mode("dequantize"):
            ref, ref_l = mod(x, experts, weights), lin(xl)
        with kernel_mode("kernels"):
            got, got_l = mod(x, experts, weights), lin(xl)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_l, ref_l, rtol=1e-5, atol=1e-5)
    assert (got[0] == 0).all()


def test_awq_refuses_gpt_oss_experts_naming_both_options():
    with pytest.raises(ConfigError, match=r"quantization='awq' is not supported with model.expert_activation="
                                          r"'clamped_swiglu' / model.expert_bias=True"):
        quantize_model(_tiny(expert_bias=True), {"scheme": "awq", "calib_path": "c.txt"}, torch.zeros(1, 4).long())
