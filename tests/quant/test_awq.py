"""moe/quant/awq.py: AWQ does what the paper says (a layer whose inputs have a few large
channels: its output error clearly below RTN's), and folding keeps the float model's function."""

import pytest
import torch

from moe.model import Transformer
from moe.quant import get_scheme
from moe.quant.apply import _convert
from moe.quant.awq import apply_awq, search_scale
from moe.quant.schemes import Scheme
from tests.conftest import tiny_model_config
from tests.record import record_measurement


def outlier_inputs(n, d, channels, gen):
    x = torch.randn(n, d, generator=gen)
    x[:, channels] *= 30.0  # a few large-magnitude input channels, as LLM activations have
    return x


def test_awq_beats_rtn_on_planted_outlier_channels():
    gen = torch.Generator().manual_seed(0)
    d, o = 256, 96
    channels = torch.tensor([3, 77, 150, 201])
    w = torch.randn(o, d, generator=gen) * 0.05
    calib, held_out = outlier_inputs(512, d, channels, gen), outlier_inputs(512, d, channels, gen)
    scheme = get_scheme("int4", 128)
    ref = held_out @ w.T
    rtn_err = float((held_out @ scheme.fake_quantize(w).T - ref).pow(2).mean())
    s = search_scale(w, calib, scheme)
    awq_err = float(((held_out / s) @ scheme.fake_quantize(w * s).T - ref).pow(2).mean())
    record_measurement("awq_vs_rtn", {"rtn_int4_mse": rtn_err, "awq_mse": awq_err, "ratio": awq_err / rtn_err})
    assert awq_err < 0.5 * rtn_err, (awq_err, rtn_err)
    assert float(s[channels].mean()) > float(s.mean())  # the salient channels were scaled up


class Identity(Scheme):
    """Stores the float weight: isolates the folding from the rounding."""

    name = "identity"

    def quantize(self, w):
        return {"w": w.float().clone()}

    def dequantize(self, q, in_features, dtype):
        return q["w"].to(dtype)


@pytest.mark.parametrize("kw", [dict(n_heads=4, n_kv_heads=4, qkv_bias=True, n_shared_experts=1, n_dense_layers=1),
                                dict()])  # MHA (o_proj folded into v rows, biases) and GQA (o_proj left alone)
def test_folded_scales_keep_the_float_function(kw):
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(n_layers=3, **kw)).eval()
    for p in model.parameters():  # non-trivial norm gains and biases
        p.data.add_(0.05 * torch.randn_like(p))
    ids = torch.randint(0, 97, (3, 20))
    with torch.no_grad():
        before = model(ids).logits
        runtime = apply_awq(model, torch.randint(0, 97, (4, 16)), get_scheme("int4", 16), n_grid=5)
        _convert(model, Identity(), runtime, all_in_scales=True)
        after = model(ids).logits
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)
    assert any((s - 1).abs().max() > 1e-3 for s in runtime.values())  # scales were really applied
