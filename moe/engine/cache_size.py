"""How many KV blocks the engine allocates (one `torch.zeros` at start; it never grows)."""

from __future__ import annotations

import math
import os

import torch

from moe.engine.config import EngineConfig
from moe.errors import ConfigError

GPU_FRACTION = 0.8  # of the free GPU memory, when nothing else is said
CPU_FRACTION = 0.25  # at most, of the available RAM, when nothing else is said
CPU_RAM_UNKNOWN = 8 * 2**30  # bytes assumed where the OS does not say


def num_kv_blocks(config: EngineConfig, bytes_per_block: int, max_model_len: int, device: torch.device) -> int:
    """The first of: `num_blocks`; `kv_cache_memory_bytes` worth of blocks;
    `kv_cache_memory_fraction` of the free (GPU) or available (CPU) memory; else 80% of the
    free GPU memory, or on CPU enough blocks for `max_num_seqs` sequences of `max_model_len`
    tokens, capped at a quarter of the available RAM."""
    if config.num_blocks is not None:
        return config.num_blocks
    if config.kv_cache_memory_bytes is not None:
        n = config.kv_cache_memory_bytes // bytes_per_block
        if n < 1:
            raise ConfigError(f"kv_cache_memory_bytes={config.kv_cache_memory_bytes} is less than one KV block "
                              f"({bytes_per_block} bytes)")
        return n
    fraction = config.kv_cache_memory_fraction
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return max(1, int(free * (fraction or GPU_FRACTION)) // bytes_per_block)
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        avail = CPU_RAM_UNKNOWN
    if fraction is not None:
        return max(1, int(avail * fraction) // bytes_per_block)
    full_length = config.max_num_seqs * math.ceil(max_model_len / config.block_size)
    return max(1, min(full_length, int(avail * CPU_FRACTION) // bytes_per_block))
