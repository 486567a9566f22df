"""Expert dispatch variants (`experts.name` / `configs/experts/<name>.yaml`): one module each,
registered in `EXPERT_DISPATCH`, which imports every module of this package when first asked."""

from moe.experts.base import EXPERT_DISPATCH, SwiGLUExperts
from moe.experts.biased import BiasedExperts

__all__ = ["EXPERT_DISPATCH", "BiasedExperts", "SwiGLUExperts"]
