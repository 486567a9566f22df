"""Training options together: router variant x expert dispatch x attention backend x activation
checkpointing. For each router, every combination's training step (loss, router losses, every
gradient, and the state a router updates in its forward) equals the reference path's (`loop`
dispatch, `eager` attention, no checkpointing) on the same batch and seed. A combination this
machine cannot run (`attention=flash` without flash-attn, `experts=triton` without a GPU or
the interpreter) is refused when the model is built, naming the option; distributed layouts are
checked against one process in tests/distributed/, resume in tests/train/test_resume.py."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from moe.config import ModelConfig
from moe.errors import UnavailableError
from moe.experts import EXPERT_DISPATCH
from moe.model import Transformer
from moe.routing.routers import ROUTERS, router_config
from moe.train.activation_checkpointing import apply_activation_checkpointing
from tests.conftest import with_variants

DISPATCHES = ["loop", "sorted", "sorted_fused"]
ATTENTIONS = ["eager", "sdpa"]
CHECKPOINTING = ["none", "full"]
# A pairwise covering set of (dispatch, attention, checkpointing): every pair of values of any two
# of them appears (6 combinations instead of 12); the router is crossed with all of them.
COMBOS = [("loop", "eager", "full"), ("loop", "sdpa", "none"), ("sorted", "eager", "none"), ("sorted", "sdpa", "full"),
          ("sorted_fused", "eager", "full"), ("sorted_fused", "sdpa", "none")]
ROUTER_OPTIONS = {"expert_choice": {"capacity_factor": 1.0}, "hash": {}, "switch": {"capacity_factor": 1.25}}


def model_config(router: str) -> ModelConfig:
    cfg = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=48,
                      max_seq_len=32)
    return with_variants(cfg, router_config(router, **ROUTER_OPTIONS.get(router, {})))


def step(model: Transformer, ids: torch.Tensor) -> dict:
    """One training forward + backward at a fixed seed: the loss, its parts, each gradient, and the
    buffers (aux_free's load counts and bias)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(123)  # router jitter draws the same noise in every combination
    out = model(ids[:, :-1], targets=ids[:, 1:], return_logits=False)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": out.loss.detach(), "grads": grads,
            "buffers": {n: b.detach().clone() for n, b in model.named_buffers() if "rotary" not in n}}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models (tests/conftest.py)


@pytest.fixture(scope="module")
def batch():
    return torch.randint(0, 96, (3, 17), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_every_dispatch_attention_and_checkpointing_equals_the_reference(router, batch):
    torch.manual_seed(0)
    base = Transformer(with_variants(model_config(router), attention="eager", experts="loop")).train()
    ref = step(copy.deepcopy(base), batch)
    assert ref["grads"], "no gradient reached the parameters"
    checked = 0
    for dispatch, attention, ckpt in COMBOS:
        model = Transformer(with_variants(model_config(router), attention=attention, experts=dispatch)).train()
        model.load_state_dict(base.state_dict())
        apply_activation_checkpointing(model, ckpt)
        got = step(model, batch)
        what = f"{router} x experts={dispatch} x attention={attention} x activation_checkpointing={ckpt}"
        torch.testing.assert_close(got["loss"], ref["loss"], rtol=1e-5, atol=1e-6, msg=what)
        assert got["grads"].keys() == ref["grads"].keys(), what
        for name, g in ref["grads"].items():
            torch.testing.assert_close(got["grads"][name], g, rtol=1e-4, atol=1e-5, msg=f"{what}: grad of {name}")
        for name, b in ref["buffers"].items():  # counted once per forward, with checkpointing too
            torch.testing.assert_close(got["buffers"][name], b, msg=f"{what}: buffer {name}")
        checked += 1
    assert checked == len(COMBOS)


def test_the_combinations_cover_every_pair():
    for (i, a), (j, b) in itertools.combinations(enumerate((DISPATCHES, ATTENTIONS, CHECKPOINTING)), 2):
        assert {(c[i], c[j]) for c in COMBOS} == set(itertools.product(a, b))


def test_a_variant_this_machine_cannot_run_is_refused_when_the_model_is_built():
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine flash-attn may be available")
    for field, name in (("attention", "flash"),):
        with pytest.raises(UnavailableError):
            Transformer(with_variants(model_config("topk"), **{field: name}))
    assert EXPERT_DISPATCH.unavailable_reason("loop") is None
