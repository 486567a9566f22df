"""moe/meta.py: `meta_device()` builds the same model as `torch.device("meta")` (names, shapes,
dtypes, ties, buffers), on meta, and leaves random fills of real tensors alone."""

import pytest
import torch

from moe.meta import meta_device
from moe.model import Transformer
from tests.conftest import tiny_model_config

CONFIGS = {
    "plain": {},
    "tied-dense-shared-mtp": dict(tie_embeddings=True, n_dense_layers=1, n_shared_experts=1, mtp_depth=1),
    "mla-qlora": dict(attention_kind="mla", n_kv_heads=4, q_lora_rank=16, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4,
                      v_head_dim=6),
    "sinks-windows-biases": dict(attention_sinks=True, sliding_window=8, layer_types=["sliding", "full"],
                                 expert_bias=True, router_bias=True, qkv_bias=True, attn_out_bias=True),
}


def _layout(model: torch.nn.Module) -> dict:
    params = {n: (tuple(p.shape), p.dtype, p.device.type) for n, p in model.named_parameters(remove_duplicate=False)}
    buffers = {n: (tuple(b.shape), b.dtype, b.device.type) for n, b in model.named_buffers()}
    return dict(params=params, buffers=buffers, ties=model.lm_head.weight is model.embed.weight)


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_meta_device_builds_what_the_meta_device_builds(case):
    cfg = tiny_model_config(**CONFIGS[case])
    with torch.device("meta"):
        reference = Transformer(cfg)
    with meta_device():
        fast = Transformer(cfg)
    assert _layout(fast) == _layout(reference)
    assert all(p.is_meta for p in fast.parameters())


def test_random_fills_of_real_tensors_still_happen_inside():
    with meta_device():
        real = torch.zeros(64, device="cpu")
        torch.nn.init.normal_(real)
        kept = torch.zeros(64, device="cpu").uniform_(1.0, 2.0)
        meta = torch.nn.init.normal_(torch.empty(3))
    assert real.std() > 0.3, "nn.init.normal_ on a CPU tensor was skipped"
    assert kept.min() >= 1.0 and kept.max() <= 2.0 and kept.std() > 0
    assert meta.is_meta and meta.shape == (3,)
    # outside the context nothing is skipped
    assert torch.nn.init.normal_(torch.zeros(64)).std() > 0.3
