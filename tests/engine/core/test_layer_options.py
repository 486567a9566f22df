"""The engine serves models with sliding-window layers and attention sinks exactly: greedy
output equals a naive recompute, also when prompts longer than the window are prefilled in
chunks; the Triton paged backend equals the torch one on such a model."""

import pytest
import torch

from moe.engine import LLM, SamplingParams
from tests.engine.conftest import build_model, naive_greedy, random_prompts

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def _windowed_model():
    model = build_model(260, seed=3, n_layers=4, layer_types=["sliding", "full", "sliding", "full"], sliding_window=5,
                        attention_sinks=True, qkv_bias=True, attn_out_bias=True, router_bias=True, expert_bias=True,
                        expert_activation="clamped_swiglu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # non-zero sinks and biases (they start at 0 / small)
        for name, p in model.named_parameters():
            if name.endswith(("sinks", "bias")):
                p.copy_(torch.randn(p.shape, generator=g))
    return model


@pytest.mark.parametrize("budget", [None, 7])  # 7 tokens a step: every prompt is prefilled in chunks
def test_greedy_equals_naive_recompute(budget):
    model = _windowed_model()
    prompts = random_prompts([3, 12, 19], seed=5)
    kw = {} if budget is None else dict(max_num_batched_tokens=budget, max_num_seqs=2)
    llm = LLM.from_model(model, None, attention_backend="torch", **kw)
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == [naive_greedy(model, p, 10) for p in prompts]


def test_the_window_and_sinks_change_the_model():
    """(So the greedy test above covers them: without them the logits of a long prompt differ.)"""
    model = _windowed_model()
    ids = torch.tensor(random_prompts([19], seed=6))
    with torch.no_grad():
        windowed = model(ids).logits
        for layer in model.layers:
            layer.attn.window, layer.attn.sinks = None, None
        full = model(ids).logits
    assert (windowed - full).abs().max() > 1e-2


def test_triton_backend_equals_torch_with_windows_sinks_and_released_blocks():
    """The Triton kernels (interpreter on CPU) serve windows and sinks: greedy equal to the torch
    backend's, with chunked prefill and this hybrid model's per-group tables, whose window group's
    released entries (NULL_BLOCK) the kernels must never read."""
    model = _windowed_model()
    prompts = random_prompts([3, 19], seed=5)
    kw = dict(max_num_batched_tokens=7, max_num_seqs=2, block_size=4)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = [o.token_ids for o in LLM.from_model(model, None, attention_backend="torch", **kw).generate(prompts, params)]
    llm = LLM.from_model(model, None, attention_backend="triton", **kw)
    assert llm.hybrid and [o.token_ids for o in llm.generate(prompts, params)] == want
