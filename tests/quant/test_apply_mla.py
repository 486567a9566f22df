"""Weight quantization of a model with Multi-head Latent Attention (moe/quant/apply.py): every
projection of the block's attention is quantized (MLA has five, not grouped-query attention's
fused qkv_proj), the engine serves the quantized model exactly as its own forward, and AWQ, whose
scale search folds into the fused qkv_proj, is refused naming both options."""

from __future__ import annotations

import copy

import pytest
import torch

from moe.config import ModelConfig
from moe.engine import LLM, SamplingParams
from moe.errors import ConfigError
from moe.model import Transformer
from moe.quant import quantize_model
from moe.quant.modules import QuantLinear

MLA = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, n_experts=4, expert_hidden=32,
                  max_seq_len=64, attention_kind="mla", q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8,
                  qk_rope_head_dim=4, v_head_dim=8)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models (tests/conftest.py)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Transformer(MLA).eval()


@pytest.mark.parametrize("spec", ["int8", {"scheme": "int4", "group_size": 8}, "fp8", "fp8_weight"],
                         ids=["int8", "int4", "fp8", "fp8_weight"])
def test_every_mla_projection_is_quantized_and_served_as_its_forward(model, spec):
    q = quantize_model(copy.deepcopy(model), spec)
    names = {n for n, m in q.layers[0].attn.named_children() if isinstance(m, QuantLinear)}
    assert names == {"q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj", "o_proj"}
    prompt = [3, 9, 14, 1, 27]
    out = LLM.from_model(q, None, collect_routing_stats=False).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0].token_ids
    ids = list(prompt)
    with torch.no_grad():  # the naive reference: a full forward of the same quantized model per token
        for _ in range(6):
            ids.append(int(q(torch.tensor([ids])).logits[0, -1].argmax()))
    assert out == ids[len(prompt):]


def test_awq_is_refused_with_mla(model, tmp_path):
    with pytest.raises(ConfigError, match=r"^quantization='awq' is not supported with model.attention_kind='mla'"):
        quantize_model(copy.deepcopy(model), {"scheme": "awq", "calib_path": str(tmp_path / "c.txt")},
                       torch.zeros(1, 8, dtype=torch.long))
