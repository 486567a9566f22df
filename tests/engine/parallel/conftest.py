"""The checkpoint the sharding tests share: one tiny model with every part tensor and expert
parallelism split (built once per session)."""

import pytest
import torch

from moe.checkpoint import save_checkpoint
from moe.config import Config, to_dict
from tests.engine.conftest import build_model

VOCAB = 261  # odd: the vocab-parallel embedding and LM head pad the vocabulary rows to a multiple of the ranks


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """Every part the sharding touches: biased q/k/v and output projections (random biases, not
    zeros), a dense layer, shared experts, two MoE layers."""
    model = build_model(VOCAB, n_layers=3, n_dense_layers=1, n_shared_experts=1, qkv_bias=True, attn_out_bias=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    path = tmp_path_factory.mktemp("tp") / "step_0000001.pt"
    return str(save_checkpoint(path, {"model": model.state_dict(), "config": to_dict(Config(model=model.cfg))}))
