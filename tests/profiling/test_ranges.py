"""`stage`: a record_function range while a profiler records, the one shared no-op otherwise."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from moe.profiling import STAGES, stage


def test_without_a_profiler_a_stage_is_the_shared_no_op():
    assert stage("routing") is stage("attention")  # no range object made, no dispatcher call
    with stage("routing"):
        pass


def test_under_a_profiler_a_stage_is_a_named_range():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ctx = stage("routing")
        with ctx:
            torch.ones(3).sum()
    assert isinstance(ctx, record_function)
    assert "routing" in {e.name for e in prof.events()}


def test_under_torch_compile_no_range_is_entered():
    @torch.compile(backend="eager", fullgraph=True)  # fullgraph: the check must not break the graph
    def f(x):
        with stage("routing"):
            return x * 2

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))
    assert "routing" not in {e.name for e in prof.events()}


def test_the_stage_names_are_the_documented_ones():
    assert STAGES == ("forward", "backward", "optimizer", "attention", "routing", "dispatch", "expert_gemm",
                      "all_to_all")
