"""What every Triton kernel family here shares: the optional `triton` import, the interpreter
switch, the "can these kernels run on that device" check, the lazy jit, and the `tl.dot` flags.

Kernels are jit-compiled on first launch (`LazyJit`), so whether they run in Triton's interpreter
is decided by `TRITON_INTERPRET` at that moment, not at import: the tests set it in
tests/conftest.py, and `kernels.compile_check` unsets it to compile for a GPU it does not have.
"""

from __future__ import annotations

import functools
import os
from typing import Callable, Optional

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the PyTorch references still work; the launchers raise a clear error
    triton = None

    class tl:  # noqa: N801  (stand-in so the kernel definitions still parse)
        constexpr = None


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def interpreting() -> bool:
    """Whether kernels launched now run in Triton's interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def runnable_reason(device: Optional[torch.device] = None, kernels: str = "the Triton kernels",
                    hint: str = "") -> Optional[str]:
    """None when Triton kernels can run on `device` (default: anywhere available), else why not.
    `kernels` names the family in the message; `hint` (" or use ...") ends the no-CUDA reason."""
    if triton is None:
        return f"{kernels} need the `triton` package (pip install triton)"
    if interpreting():
        return None
    ok = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    if not ok:
        where = "this machine has no CUDA device" if device is None else f"got device {device}"
        return (f"{kernels} run on CUDA ({where}); on CPU set TRITON_INTERPRET=1 before the first launch "
                f"(slow, for tests){hint}")
    return None


def check_launch(kernels: str, *tensors: torch.Tensor, hint: str = "") -> None:
    """Raise RuntimeError (the `runnable_reason`) unless the kernels can run on every tensor's device."""
    for t in tensors:
        reason = runnable_reason(t.device, kernels, hint)
        if reason is not None:
            raise RuntimeError(reason)


def pow2(x: int, lo: int = 1) -> int:
    """The smallest power of two >= x and >= lo (Triton block shapes are powers of two)."""
    return max(lo, 1 << (max(int(x), 1) - 1).bit_length())


def dot_flags(dtype: torch.dtype, allow_tf32: bool) -> dict:
    """The `UPCAST` / `IEEE` constexprs of kernels whose tiles go through `tl.dot`.
    UPCAST: the interpreter's tl.dot is wrong for bf16/fp16, so 16-bit tiles are upcast there.
    IEEE: exact fp32 products for fp32 inputs, unless `allow_tf32` (TF32 tensor cores)."""
    return dict(UPCAST=interpreting() and dtype != torch.float32, IEEE=dtype == torch.float32 and not allow_tf32)


@functools.lru_cache(maxsize=None)
def _jit(fn: Callable, interpret: bool):
    """One `triton.jit(fn)` per function and mode (`interpret` is the cache key; triton.jit reads
    the mode from the environment), so every kernel calling a helper finds the same object."""
    return triton.jit(fn)


class LazyJit:
    """`triton.jit(fn)`, made on first use in the mode (interpreter or compiled) of that moment,
    and again for the other mode if TRITON_INTERPRET changes (a compiled kernel cannot call an
    interpreter function, nor the reverse).

    `helpers` maps the global names the kernel calls (`@triton.jit` functions) to their plain
    functions: they are jitted in the same mode and bound into the kernel's module globals before
    every use, so the kernel always finds the helpers of its own mode."""

    def __init__(self, fn: Callable, helpers: Optional[dict] = None):
        self.fn, self.helpers = fn, dict(helpers or {})

    def get(self):
        mode = interpreting()
        for name, helper in self.helpers.items():
            self.fn.__globals__[name] = _jit(helper, mode)
        return _jit(self.fn, mode)

    def __getitem__(self, grid):
        return self.get()[grid]


def triton_configs(rows, names) -> list:
    """`triton.Config`s from table rows `(*tiles named by names, warps, stages)`."""
    return [triton.Config(dict(zip(names, r[:-2])), num_warps=r[-2], num_stages=r[-1]) for r in rows]


class TunedKernel:
    """A kernel function, jit-compiled on first launch (again if TRITON_INTERPRET changed); on CUDA
    wrapped in `triton.autotune` over the table `rows` unless the caller fixes the tile sizes."""

    def __init__(self, fn, rows, names, key, reset_to_zero=None, helpers: Optional[dict] = None):
        self.kernel = LazyJit(fn, helpers)
        self.rows, self.names, self.key, self.reset = rows, names, key, reset_to_zero
        self._tuned = None

    def launch(self, grid, args, meta: dict, tiles: Optional[dict], interpret_tiles: dict):
        """`grid(tiles) -> tuple`; `tiles` fixes the tuned meta-parameters (None: autotune on CUDA)."""
        if interpreting() or tiles is not None:
            tiles = dict(interpret_tiles if tiles is None else tiles)
            self.kernel[grid(tiles)](*args, **meta, **tiles)
            return
        jitted = self.kernel.get()  # binds the helpers of this mode
        if self._tuned is None:
            self._tuned = triton.autotune(configs=triton_configs(self.rows, self.names), key=self.key,
                                          reset_to_zero=self.reset)(jitted)
        self._tuned[lambda m: grid(m)](*args, **meta)
