"""Expert dispatch variants (`experts.name` / `configs/experts/<name>.yaml`)."""

from moe.experts.base import EXPERT_DISPATCH, SwiGLUExperts
from moe.experts.biased import BiasedExperts
from moe.experts import loop, sorted  # noqa: F401  (register "loop" and "sorted")
from moe.experts import sorted_fused, triton  # noqa: F401  (register "sorted_fused" and "triton": Triton grouped GEMMs)

__all__ = ["EXPERT_DISPATCH", "BiasedExperts", "SwiGLUExperts"]
