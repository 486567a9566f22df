"""How many KV blocks the engine allocates (one `torch.zeros` at start; it never grows).

On a GPU, unless the size is given, the cache gets what is left of the free memory (after the
weights are loaded) once the measured peak of one forward at `max_num_batched_tokens` tokens and
a reserve are set aside (moe.engine.memory.memory_profile); the plan is logged. `python -m
moe.engine.memory.plan` prints the same plan for any model without a GPU.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import torch

from moe.engine.config import EngineConfig
from moe.engine.memory import memory_profile
from moe.engine.memory.kv_groups import blocks_held
from moe.errors import ConfigError

GPU_FRACTION = 0.8  # of the free GPU memory, when nothing else is said
CPU_FRACTION = 0.25  # at most, of the available RAM, when nothing else is said
CPU_RAM_UNKNOWN = 8 * 2**30  # bytes assumed where the OS does not say

logger = logging.getLogger(__name__)


def num_kv_blocks(config: EngineConfig, bytes_per_block: int, max_model_len: int, device: torch.device,
                  model=None, sliding_window: Optional[int] = None, windows: Optional[list] = None) -> int:
    """The first of: `num_blocks`; `kv_cache_memory_bytes` worth of blocks;
    `kv_cache_memory_fraction` of the free (GPU) or available (CPU) memory; else on a GPU the
    profiled plan (`model` given: free memory - peak activations - reserve; without it 80% of
    the free memory), or on CPU enough blocks for `max_num_seqs` sequences of `max_model_len`
    tokens, capped at a quarter of the available RAM. `sliding_window`: the engine frees the blocks
    that window passed (every layer slides), so a sequence counts at most its window's blocks
    (plus one step's chunk), not its full length. `windows`: a hybrid model's KV cache groups (one
    entry per group, None for full attention; a block then holds one layer of each group): a sequence
    counts its blocks in every group."""
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
        # CUDA graphs (compile) and a speculative drafting cache are allocated after the KV cache and are not in
        # the plan: those engines keep the 80%-of-free rule's headroom
        if fraction is None and model is not None and not config.compile and config.speculative is None:
            return profiled_blocks(config, bytes_per_block, max_model_len, device, model, sliding_window)
        free, _total = torch.cuda.mem_get_info(device)
        return max(1, int(free * (fraction or GPU_FRACTION)) // bytes_per_block)
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        avail = CPU_RAM_UNKNOWN
    if fraction is not None:
        return max(1, int(avail * fraction) // bytes_per_block)
    per_seq = sum(blocks_held(max_model_len, config.block_size, w, config.max_num_batched_tokens)
                  for w in (windows if windows else [sliding_window]))
    return max(1, min(config.max_num_seqs * per_seq, int(avail * CPU_FRACTION) // bytes_per_block))


def profiled_blocks(config: EngineConfig, bytes_per_block: int, max_model_len: int, device: torch.device,
                    model, sliding_window: Optional[int] = None) -> int:
    """KV blocks in the free GPU memory less one measured forward's peak and the reserve."""
    peak = memory_profile.measure_peak_activations(model, config.max_num_batched_tokens, config.max_num_seqs)
    free, total = torch.cuda.mem_get_info(device)
    plan = memory_profile.MemoryPlan(total, total - free, peak, memory_profile.default_reserve(total),
                                     bytes_per_block, config.block_size, config.max_num_batched_tokens, max_model_len,
                                     measured=True, sliding_window=sliding_window)
    logger.info("engine memory plan (%s; 'weights' = all memory in use before the cache):\n%s", device,
                "\n".join("  " + line for line in plan.lines()))
    if plan.num_blocks < 1:
        raise ConfigError(f"no GPU memory is left for the KV cache: {'; '.join(plan.lines())}. Lower "
                          "max_num_batched_tokens, use a smaller dtype or quantization, or set kv_cache_memory_bytes")
    return plan.num_blocks

