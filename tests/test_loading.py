"""`moe.load_model` of a moe-lab checkpoint: built on the meta device (nothing initialised or
allocated before the weights arrive), memory-mapped, converted once to the target dtype, tied
tables still tied. Peak memory: tests/benchmarks/test_load_checkpoint.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from moe.checkpoint import checkpoint_path, save_checkpoint
from moe.config import Config, TrainConfig, to_dict
from moe.routing.routers import router_config
from moe.loading import load_model
from moe.model import Transformer
from tests.conftest import tiny_model_config


@pytest.fixture
def init_calls(monkeypatch):
    """Every tensor torch.nn.init touches while the test runs, and whether it was on meta."""
    seen: list[bool] = []
    for name in ("normal_", "ones_", "zeros_"):
        real = getattr(nn.init, name)

        def spy(*a, _real=real, **k):
            seen.append((a[0] if a else k["tensor"]).is_meta)
            return _real(*a, **k)

        monkeypatch.setattr(nn.init, name, spy)
    return seen


@pytest.mark.parametrize("tie, router", [(True, "topk"), (False, "aux_free")])
def test_checkpoint_loads_into_a_meta_model(tmp_path, init_calls, tie, router):
    cfg = Config(model=tiny_model_config(tie_embeddings=tie, router=router_config(name=router, top_k=2)),
                 train=TrainConfig(seq_len=32))
    saved = Transformer(cfg.model)
    with torch.no_grad():
        for p in saved.parameters():
            p.add_(torch.randn(p.shape))  # nothing equals a fresh init
    optimizer = {"state": {0: {"exp_avg": torch.ones(3)}}, "param_groups": []}
    path = save_checkpoint(checkpoint_path(tmp_path, 1), {"model": saved.state_dict(), "optimizer": optimizer,
                                                          "config": to_dict(cfg), "step": 1})
    init_calls.clear()
    model, _, _ = load_model(path)
    assert init_calls and all(init_calls)  # reset_parameters ran, on meta tensors only
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    want = saved.state_dict()
    assert model.state_dict().keys() == want.keys()
    assert all(torch.equal(t, want[k]) for k, t in model.state_dict().items())
    assert (model.lm_head.weight is model.embed.weight) == tie
    ids = torch.randint(0, cfg.model.vocab_size, (2, 9))
    saved.eval()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, saved(ids).logits)
    half, _, _ = load_model(path, dtype="bf16")
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert half.rotary.cos.dtype == torch.float32
    assert torch.equal(half.layers[0].attn.qkv_proj.weight, saved.layers[0].attn.qkv_proj.weight.bfloat16())
    assert (half.lm_head.weight is half.embed.weight) == tie
    if tie:  # one tensor stored twice under two names: converted once, one Parameter
        assert len(list(half.parameters())) == len(list(saved.parameters()))


def test_page_releaser_gives_back_mapped_pages_without_losing_data(tmp_path):
    """Pages of a memory-mapped checkpoint tensor are dropped and re-read from the file when used
    again; a tensor in ordinary (anonymous) memory is never touched, where dropping would zero it."""
    from moe.checkpoint import load_checked, page_releaser

    big = torch.randn(256, 1024)  # 1 MiB: many whole pages
    path = tmp_path / "x.pt"
    torch.save({"model": {"w": big}, "config": {}, "format_version": 1}, path)
    state = load_checked(path, path, ("model",))
    release = page_releaser(path)
    mapped = state["model"]["w"]
    release(mapped)
    assert torch.equal(mapped, big)
    anonymous = big.clone()
    release(anonymous)
    assert torch.equal(anonymous, big)


def mapped_rss_kib(path) -> int:
    """Resident KiB of this process's mappings of `path` (/proc/self/smaps)."""
    import os
    target, total, inside = os.path.realpath(path), 0, False
    for line in open("/proc/self/smaps"):
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and ":" in head[3]:  # a mapping's first line
            inside = len(head) == 6 and os.path.realpath(head[5].rstrip("\n")) == target
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs /proc (Linux)")
def test_page_releaser_really_drops_the_resident_pages(tmp_path):
    """The pages of a mapped tensor leave the process's resident set (re-read when touched again),
    also for a file whose path has spaces (the maps line's path field is the rest of the line)."""
    from moe.checkpoint import load_checked, page_releaser
    path = tmp_path / "a dir with spaces" / "x y.pt"
    path.parent.mkdir()
    big = torch.randn(1024, 1024)  # 4 MiB
    torch.save({"model": {"w": big}, "config": {}, "format_version": 1}, path)
    state = load_checked(path, path, ("model",))
    mapped = state["model"]["w"]
    float(mapped.sum())  # touch every page
    before = mapped_rss_kib(path)
    assert before >= 3 * 1024, before
    page_releaser(path)(mapped)
    assert mapped_rss_kib(path) <= 64, (before, mapped_rss_kib(path))  # only the pages around the tensor's ends
    assert torch.equal(mapped, big)  # re-read from the file
