"""`kernels/runtime.py`: the interpreter switch, the "can the kernels run here" reasons and launch
check, the block-size and `tl.dot` flag helpers, and the lazy jit with per-mode helper binding."""

import pytest
import torch

from kernels import runtime
from kernels.runtime import LazyJit, check_launch, dot_flags, interpreting, pow2, runnable_reason, tl

triton = pytest.importorskip("triton")


@pytest.mark.parametrize("value,on", [("1", True), ("true", True), ("ON", True), ("0", False), ("", False),
                                      ("no", False)])
def test_interpreting_reads_triton_interpret_now(monkeypatch, value, on):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert interpreting() is on


def test_runnable_reason_names_the_kernels_the_fix_and_the_hint(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    reason = runnable_reason(torch.device("cpu"), "the Triton toy kernels", " or use the toy reference")
    assert reason == ("the Triton toy kernels run on CUDA (got device cpu); on CPU set TRITON_INTERPRET=1 before "
                      "the first launch (slow, for tests) or use the toy reference")
    assert runnable_reason(torch.device("cuda")) is None  # a CUDA device: nothing in the way
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert runnable_reason(torch.device("cpu")) is None and runnable_reason() is None
    monkeypatch.setattr(runtime, "triton", None)
    assert runnable_reason(None, "the Triton toy kernels") == \
        "the Triton toy kernels need the `triton` package (pip install triton)"


def test_check_launch_checks_every_tensor(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    meta = torch.empty(1, device="meta")  # any non-CUDA tensor is refused, not only CPU ones
    with pytest.raises(RuntimeError, match=r"the Triton toy kernels run on CUDA \(got device meta\).*or use X"):
        check_launch("the Triton toy kernels", meta, hint=" or use X")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    check_launch("the Triton toy kernels", torch.zeros(1), meta)


def test_pow2():
    assert [pow2(x) for x in (0, 1, 2, 3, 5, 16, 17)] == [1, 1, 2, 4, 8, 16, 32]
    assert pow2(3, lo=16) == 16 and pow2(40, lo=16) == 64


def test_dot_flags(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter's tl.dot needs fp32 tiles
    assert dot_flags(torch.bfloat16, allow_tf32=False) == dict(UPCAST=True, IEEE=False)
    assert dot_flags(torch.float32, allow_tf32=False) == dict(UPCAST=False, IEEE=True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert dot_flags(torch.float16, allow_tf32=False) == dict(UPCAST=False, IEEE=False)
    assert dot_flags(torch.float32, allow_tf32=True) == dict(UPCAST=False, IEEE=False)  # TF32 allowed


def _twice_fn(x):
    return x * 2


def _twice_kernel(X, Y, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Y + i, _twice(tl.load(X + i)))


_twice = None  # bound by LazyJit


def test_lazy_jit_binds_the_helper_of_the_launch_mode(monkeypatch):
    kernel = LazyJit(_twice_kernel, {"_twice": _twice_fn})
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x, y = torch.arange(16, dtype=torch.float32), torch.zeros(16)
    kernel[(1,)](x, y, N=16)
    assert torch.equal(y, 2 * x)
    interpreted, helper = kernel.get(), globals()["_twice"]
    assert kernel.get() is interpreted, "jitted once per mode"
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # jitted anew for the compiled mode (not launched here)
    compiled = kernel.get()
    assert compiled is not interpreted and globals()["_twice"] is not helper
    assert type(compiled).__name__ == "JITFunction" and type(interpreted).__name__ != "JITFunction"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernel.get() is interpreted and globals()["_twice"] is helper  # the interpreter's helper again
