"""The slow tier: every MoE layer's expert weights in one safetensors file, memory-mapped.

On a CPU-only machine an expert is read from the mapped file only when a load copies it into a
fast-tier slot (the kernel's page cache is then the real slow tier: a second read of a page is
a memory copy, not a disk read). On CUDA the mapped file is copied once into pinned host memory,
so a load is one DMA over PCIe that can run on a side stream.

Written with `safetensors.torch.save_file` (the format every other tool reads); read back by
hand: the header gives each tensor's byte range, and `torch.UntypedStorage.from_file` maps the
file, so one expert's bytes are a zero-copy view (safetensors' own `get_slice` copies each read).
"""

from __future__ import annotations

import json
import os
import struct

import torch
from safetensors.torch import save_file

from moe.dtypes import resolve_dtype

_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def write_slow_tier(path: str, experts_by_layer: dict[int, tuple[torch.Tensor, torch.Tensor]], dtype) -> None:
    """`experts_by_layer[l] = (gate_up_E2HD, down_EDH)` -> `layers.<l>.gate_up_proj` / `.down_proj`."""
    tensors = {}
    for layer, (gate_up, down) in experts_by_layer.items():
        tensors[f"layers.{layer}.gate_up_proj"] = gate_up.detach().to("cpu", resolve_dtype(dtype)).contiguous()
        tensors[f"layers.{layer}.down_proj"] = down.detach().to("cpu", resolve_dtype(dtype)).contiguous()
    save_file(tensors, path)


class SlowTier:
    """`expert(layer, e)` -> (gate_up_2HD, down_DH): views of the mapped file (or of pinned host
    copies on CUDA), never copies."""

    def __init__(self, path: str, pin: bool = False):
        self.path = path
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        size = os.path.getsize(path)
        storage = torch.UntypedStorage.from_file(path, shared=False, nbytes=size)  # MAP_PRIVATE: lazy pages
        raw_B = torch.empty(0, dtype=torch.uint8).set_(storage)
        self.tensors: dict[str, torch.Tensor] = {}
        for name, info in header.items():
            start, end = (8 + n + o for o in info["data_offsets"])
            t = raw_B[start:end].view(_SAFETENSORS_DTYPES[info["dtype"]]).view(info["shape"])
            self.tensors[name] = t.pin_memory() if pin else t

    def expert(self, layer: int, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tensors[f"layers.{layer}.gate_up_proj"][e], self.tensors[f"layers.{layer}.down_proj"][e]

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tensors[f"layers.{layer}.gate_up_proj"], self.tensors[f"layers.{layer}.down_proj"]
