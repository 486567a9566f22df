"""The slow tier: every MoE layer's per-expert tensors in one safetensors file, memory-mapped, in
their stored form (`stored.py`: full-precision weights and biases, or a quantized module's codes,
scales and zero points).

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

_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                       "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64,
                       "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def write_slow_tier(path: str, experts_by_layer: dict[int, dict[str, torch.Tensor]]) -> None:
    """`experts_by_layer[l][name]` (an `[E, ...]` host tensor, already in the dtype to serve) ->
    `layers.<l>.<name>`. safetensors orders tensors by dtype size, so each starts aligned for its view."""
    tensors = {f"layers.{layer}.{name}": t.detach().contiguous()
               for layer, named in experts_by_layer.items() for name, t in named.items()}
    save_file(tensors, path)


class SlowTier:
    """`expert(layer, e)` -> {name: tensor of expert e}: views of the mapped file (or of pinned host
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
        self.layers: dict[int, dict[str, torch.Tensor]] = {}
        for key, info in header.items():
            start, end = (8 + n + o for o in info["data_offsets"])
            t = raw_B[start:end].view(_SAFETENSORS_DTYPES[info["dtype"]]).view(info["shape"])
            _, layer, name = key.split(".", 2)
            self.layers.setdefault(int(layer), {})[name] = t.pin_memory() if pin else t

    def expert(self, layer: int, e: int) -> dict[str, torch.Tensor]:
        return {name: t[e] for name, t in self.layers[layer].items()}

    def layer(self, layer: int) -> dict[str, torch.Tensor]:
        return self.layers[layer]
