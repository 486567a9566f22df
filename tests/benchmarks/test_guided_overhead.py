"""benchmarks/guided_overhead.py: one timed run of a batch, unconstrained and constrained, gives
per-step figures, with guided work counted only where there is some."""

from __future__ import annotations

import torch

from benchmarks.guided_overhead import run_once
from moe.engine import LLM, SamplingParams


def test_run_once_per_step_figures(tiny_model, tok):
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more intra-op threads only spin on shared cores
    try:
        llm = LLM.from_model(tiny_model, tok, seed=0, collect_routing_stats=False)
        prompts = [tok.encode(t) for t in ("the quick fox", "once upon a time", "experts route")]
        plain = run_once(llm, prompts, [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)] * 3)
        assert plain["steps"] == 6 and plain["output_tokens"] == 18
        assert plain["step_ms"] >= plain["model_ms"] > 0 and plain["guided_fill_ms"] == plain["guided_apply_ms"] == 0
        guided = run_once(llm, prompts, [SamplingParams(temperature=0, max_tokens=6, guided={"regex": "[a-z]{6}"})] * 3)
        # six letters (BPE tokens hold one or more), then the forced eos
        assert 2 <= guided["steps"] <= 7 and guided["output_tokens"] <= 21
        assert guided["guided_fill_ms"] > 0 and guided["guided_apply_ms"] > 0
    finally:
        torch.set_num_threads(n)


def test_main_past_the_trained_context_only_when_allowed(tmp_path):
    """The structured prompts run past a 256-position checkpoint: refused by the engine unless
    --allow-long-context; with it, the JSON keeps every repeat of both modes and the best of each."""
    import json

    import pytest

    from benchmarks.guided_overhead import main
    from benchmarks.soak import tiny_checkpoint
    from moe.errors import ConfigError

    ckpt, out = tiny_checkpoint(tmp_path), tmp_path / "g.json"
    argv = ["--checkpoint", str(ckpt), "--batch", "2", "--max-tokens", "3", "--repeats", "2", "--threads", "1",
            "--out", str(out)]
    with pytest.raises(ConfigError, match="max_seq_len"):
        main(argv)
    assert not out.exists()
    assert main(argv + ["--allow-long-context"]) == 0
    rec = json.loads(out.read_text())
    assert [len(rec["runs"][m]) for m in ("unconstrained", "constrained")] == [2, 2]
    for m in ("unconstrained", "constrained"):
        assert rec["results"][m] == min(rec["runs"][m], key=lambda r: r["step_ms"])
    assert rec["runs"]["unconstrained"][0]["output_tokens"] == 6  # 2 requests x 3 tokens (ignore_eos)
