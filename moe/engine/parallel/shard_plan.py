"""Which part of each full tensor rank r keeps: the slicing of `shard.py`, written as data, so that
`shard_load.py` can read only that part from the checkpoint (tests check the two agree: a rank
loaded in slices equals `shard_model` applied to the whole model).

A `Selection` keeps, along one dimension `dim`, the concatenation of the full tensor's ranges
`ranges` (q, k and v rows of a fused projection; gate and up rows of a stacked expert), then
zero rows up to `size` (the vocabulary padded to a multiple of the ranks); every other dimension
whole. `zero=True`: a tensor of zeros of the full shape (a row-parallel bias, added by rank 0 only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from moe.config import ModelConfig


@dataclass(frozen=True)
class Selection:
    dim: int
    ranges: tuple[tuple[int, int], ...]
    size: int  # the shard's length along `dim` (>= the ranges' total: the rest is zeros)
    zero: bool = False

    @property
    def kept(self) -> int:
        return sum(hi - lo for lo, hi in self.ranges)


def whole(shape: tuple) -> Selection:
    n = shape[0] if shape else 1
    return Selection(0, ((0, n),), n)


def chunk(shape: tuple, dim: int, r: int, T: int) -> Selection:
    n = shape[dim] // T
    return Selection(dim, ((r * n, (r + 1) * n),), n)


def selection(name: str, shape: tuple, cfg: ModelConfig, r: int, T: int, expert_parallel: bool) -> Selection:
    """What rank `r` of `T` keeps of the full tensor `name` (a state-dict name of the unsharded
    model, `shape` its full shape); mirrors `shard.py` (attention by heads, FFNs by hidden units,
    experts by hidden units or whole with `expert_parallel`, vocabulary by rows)."""
    leaf = name.rsplit(".", 1)[-1]
    if name in ("embed.weight", "lm_head.weight"):
        V, n = shape[0], -(-shape[0] // T)
        return Selection(0, ((min(r * n, V), min((r + 1) * n, V)),), n)
    if ".attn." in name:
        return _attention(name, shape, cfg, r, T)
    if ".ffn.experts." in name:
        if expert_parallel:
            return chunk(shape, 0, r, T)
        if leaf == "gate_up_proj":  # [E, 2H, D]: this rank's gate rows, then its up rows
            Hx, h = shape[1] // 2, shape[1] // 2 // T
            return Selection(1, ((r * h, (r + 1) * h), (Hx + r * h, Hx + (r + 1) * h)), 2 * h)
        return chunk(shape, 2, r, T)  # down_proj [E, D, H]
    if re.search(r"\.ffn\.(shared\.)?(gate|up)_proj\.weight$", name):
        return chunk(shape, 0, r, T)
    if re.search(r"\.ffn\.(shared\.)?down_proj\.weight$", name):
        return chunk(shape, 1, r, T)
    return whole(shape)  # norms, routers, gates: replicated


def _attention(name: str, shape: tuple, cfg: ModelConfig, r: int, T: int) -> Selection:
    d, H, G = cfg.resolved_head_dim, cfg.n_heads, cfg.n_kv_heads
    if ".qkv_proj." in name:  # this rank's query heads, then its kv heads (a GQA group stays on one rank)
        q, g = H // T * d, G // T * d
        k0, v0 = H * d, (H + G) * d
        return Selection(0, ((r * q, (r + 1) * q), (k0 + r * g, k0 + (r + 1) * g), (v0 + r * g, v0 + (r + 1) * g)),
                         q + 2 * g)
    if name.endswith("o_proj.weight"):
        return chunk(shape, 1, r, T)
    if name.rsplit(".", 2)[-2] in ("q_proj", "q_b_proj", "kv_b_proj"):  # MLA: rows by heads (q_a, kv_a: whole)
        return chunk(shape, 0, r, T)
    if name.endswith("o_proj.bias"):  # added once, by rank 0's partial sum
        return whole(shape) if r == 0 else Selection(0, (), shape[0], zero=True)
    if name.endswith("attn.sinks"):
        return chunk(shape, 0, r, T)
    return whole(shape)  # per-head-dim q/k norms
