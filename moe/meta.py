"""Build modules on the meta device (shapes only: no memory, no values) without paying for their
random init.

`torch.device("meta")` alone still runs each module's init on the meta tensors. That computes
nothing, but the first `normal_` on a meta tensor costs 2-4 s: PyTorch registers its meta
decompositions lazily on that first call. Every route that builds a model on meta and then fills
it (HF import, checkpoint loading, the memory planner, FSDP materialisation) paid that once per
process. `meta_device()` skips the random-init ops on meta tensors, which only ever write values
a meta tensor does not have, so what is built (parameters, buffers, shapes, dtypes, ties) is the
same; only the time differs (tests/test_meta.py checks both).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode

# The in-place random fills of nn.init (what modules' reset_parameters call) and of Tensor.
# Deterministic fills (zero_, fill_, ones_) are cheap on meta and left alone.
_RANDOM_FILLS = frozenset({
    torch.nn.init.normal_, torch.nn.init.uniform_, torch.nn.init.trunc_normal_, torch.nn.init.kaiming_uniform_,
    torch.nn.init.kaiming_normal_, torch.nn.init.xavier_uniform_, torch.nn.init.xavier_normal_,
    torch.nn.init.orthogonal_, torch.nn.init.sparse_,
    torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.exponential_, torch.Tensor.log_normal_,
    torch.Tensor.cauchy_, torch.Tensor.geometric_, torch.Tensor.random_, torch.Tensor.bernoulli_})


class _SkipRandomFillsOnMeta(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _RANDOM_FILLS:
            t = args[0] if args else kwargs.get("tensor")
            if isinstance(t, torch.Tensor) and t.is_meta:
                return t  # in place: the fill returns its (unchanged, value-less) input
        return func(*args, **kwargs)


@contextlib.contextmanager
def meta_device() -> Iterator[None]:
    """`with meta_device(): model = Transformer(cfg)`: as `torch.device("meta")`, without init cost."""
    with torch.device("meta"), _SkipRandomFillsOnMeta():
        yield
