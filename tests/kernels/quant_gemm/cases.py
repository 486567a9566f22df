"""Inputs of the quantized GEMM kernel tests: stored weights with random codes (every int8 value,
every nibble, every finite E4M3 byte), random fp32 scales and zero points, in `moe.quant`'s layout.

The kernels run in the Triton interpreter on CPU (TRITON_INTERPRET=1 set before the first launch;
an explicit TRITON_INTERPRET=0 is respected, to run the compiled kernels on a GPU). Odd sizes
throughout; 16-wide tiles (`SMALL`) so every loop runs over several tiles, and int4 groups (24)
that straddle K tiles."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from kernels.quant_gemm import QuantWeight  # noqa: E402
from kernels.runtime import interpreting  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
SMALL_LINEAR = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
SMALL = dict(BLOCK_N=16, BLOCK_K=16)


def random_weight(fmt: str, lead: tuple, O: int, I: int, group_size: int = 24, seed: int = 0) -> QuantWeight:
    g = torch.Generator().manual_seed(seed)
    scale_shape = (*lead, O, -(-I // group_size) if fmt == "int4" else 1)
    scale = (torch.rand(scale_shape, generator=g) * 0.02 + 0.002).to(DEVICE)
    if fmt == "int8":
        q = torch.randint(-127, 128, (*lead, O, I), generator=g, dtype=torch.int8)
        return QuantWeight(fmt, q.to(DEVICE), scale, None, I)
    if fmt == "fp8":
        q = torch.randint(0, 256, (*lead, O, I), generator=g, dtype=torch.uint8)
        q = torch.where((q & 0x7F) == 0x7F, q - 1, q)  # 0x7f / 0xff are NaN in E4M3; the schemes never store them
        return QuantWeight(fmt, q.to(DEVICE), scale / 100, None, I)
    n_groups = scale_shape[-1]
    q = torch.randint(0, 256, (*lead, O, n_groups * group_size // 2), generator=g, dtype=torch.uint8)
    zero = torch.randint(0, 16, scale_shape, generator=g, dtype=torch.uint8)
    return QuantWeight(fmt, q.to(DEVICE), scale, zero.to(DEVICE), I, group_size)
