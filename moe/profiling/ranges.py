"""The model's stages as `record_function` ranges, entered only while a profiler records.

`torch.profiler.record_function` costs a dispatcher call (~15 us on a small CPU) even when no
profiler runs; a model step enters dozens of ranges, so `stage` asks first whether a profiler
is recording (a flag read, ~0.2 us) and hands back a shared no-op context otherwise. Under
torch.compile no range is entered: Dynamo would trace the check itself.
"""

from __future__ import annotations

import contextlib

import torch
from torch.autograd import _profiler_enabled
from torch.profiler import record_function

# Every stage name, in the order the summaries list them. forward / backward / optimizer are the
# trainer's top-level ranges (the engine's step has a forward); the others are nested in them.
STAGES = ("forward", "backward", "optimizer", "attention", "routing", "dispatch", "expert_gemm", "all_to_all")

_NO_RANGE = contextlib.nullcontext()  # stateless and reentrant: one instance serves every call


def stage(name: str):
    """`with stage("routing"): ...`: a profiler range named after one of `STAGES` while a
    profiler records, nothing otherwise."""
    if torch.compiler.is_compiling() or not _profiler_enabled():
        return _NO_RANGE
    return record_function(name)
