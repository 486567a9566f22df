import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")
# Triton kernels run in Triton's interpreter on machines without CUDA. `@triton.jit` reads
# this when a kernel module is imported, so it must be set before any test imports moe.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_SILENT", "true")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def tiny_model_config(**kw):
    from moe.config import ModelConfig
    base = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=24,
                max_seq_len=64)
    base.update(kw)
    return ModelConfig(**base)
