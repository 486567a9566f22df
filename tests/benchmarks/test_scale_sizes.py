"""benchmarks/scale_sizes.py: its parameter counts (a plain formula over the published HF fields)
equal, exactly, those of our Transformer built on the meta device from the same configs, and its
KV bytes per token equal what the engine allocates per block / block_size."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from benchmarks.scale_sizes import MODELS, main, sizes
from moe.engine.runner.context import PagedKVContext
from moe.hf.convert import model_config_from_hf
from moe.model import Transformer


@pytest.mark.parametrize("name", list(MODELS))
def test_formula_counts_equal_a_meta_build_of_the_same_config(name):
    fields = dict(MODELS[name])
    cfg = model_config_from_hf(AutoConfig.for_model(fields.pop("model_type"), **fields))
    with torch.device("meta"):
        model = Transformer(cfg)
    s = sizes(MODELS[name])
    assert s["params"] == model.num_params()
    assert s["active"] == model.num_params(active=True)
    per_block = PagedKVContext.bytes_per_block(cfg.n_layers, 16, cfg.n_kv_heads, cfg.resolved_head_dim, torch.bfloat16)
    assert s["kv_elems_per_token"] * 2 == per_block // 16


def test_the_report_prints_the_documented_figures(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "| Mixtral-8x7B-v0.1 | 46.70B | 12.88B | 186.8 | 93.4 | 46.7 | 23.4 | 128 KiB |" in out
    assert "| Qwen3-30B-A3B | 30.53B | 3.35B | 122.1 | 61.1 | 30.5 | 15.3 | 96 KiB |" in out
    assert "| OLMoE-1B-7B-0924 | 6.92B | 1.28B | 27.7 | 13.8 | 6.9 | 3.5 | 128 KiB |" in out
