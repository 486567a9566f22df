"""Split a loaded `Transformer` in place into this rank's shard (Megatron-style tensor parallelism).

Per block:
  attention   qkv_proj column-parallel (this rank's query heads and their kv heads: heads
              r*H/T.. and r*G/T.., so the GQA grouping stays local), o_proj row-parallel; the
              partial outputs are summed by one all-reduce (a forward hook on o_proj). The KV cache
              of a rank holds only its kv heads. Sink logits are split with their heads.
              MLA (DeepSeek): its query and kv_b projections by heads, the latent replicated
              (`shard_mla`: every rank caches the whole latent row of each token).
  FFN         dense SwiGLU and shared experts: gate/up column-parallel, down row-parallel; routed
              experts either split the same way inside every expert (TP: each rank a slice of the
              hidden units of all E experts) or placed whole (`expert_parallel`: rank r holds
              experts r*E/T..(r+1)*E/T-1). Either way each rank's FFN output is a partial sum and
              one all-reduce (a forward hook on the block's FFN) completes it.
The router is replicated (small, and every rank needs the routing of every token).

Why EP is an all-reduce and not an all-to-all: with tensor-parallel attention every rank already
holds every token's hidden state after the attention all-reduce, so dispatching tokens to expert
owners would send them what they have. Each rank runs its own experts on the tokens routed to
them (the others' assignments are marked dropped) and the one FFN all-reduce (= reduce-scatter +
all-gather) combines. An all-to-all pays off only with data-parallel attention (each rank holding
different tokens), which this engine does not do (moe/distributed/expert_parallel.py is the
training side's all-to-all).

Embedding and LM head are vocab-parallel: rank r holds rows r*Vp/T.. of the (zero-padded to a
multiple of T) vocabulary; the embedding lookup is completed by an all-reduce, the logits by an
all-gather along the vocabulary (then cut to V), so rank 0 samples from the full row.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from moe.engine.parallel.comm import RankGroup
from moe.experts import SwiGLUExperts


def _rows(w: torch.Tensor, r: int, T: int, dim: int = 0) -> torch.Tensor:
    n = w.shape[dim] // T
    return w.narrow(dim, r * n, n).clone()


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    lin.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        lin.bias = nn.Parameter(bias, requires_grad=False)
    return lin


def _all_reduce_output(group: RankGroup):
    def hook(_module, _args, out):
        if isinstance(out, tuple):  # MoE: (y, aux_loss, record)
            return (group.all_reduce(out[0]),) + out[1:]
        return group.all_reduce(out)
    return hook


def shard_attention(attn: nn.Module, group: RankGroup) -> None:
    r, T = group.rank, group.size
    H, G, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    w, b = attn.qkv_proj.weight.detach(), attn.qkv_proj.bias
    q, k, v = w.split([H * d, G * d, G * d])
    weight = torch.cat([_rows(q, r, T), _rows(k, r, T), _rows(v, r, T)])
    bias = None
    if b is not None:
        qb, kb, vb = b.detach().split([H * d, G * d, G * d])
        bias = torch.cat([_rows(qb, r, T), _rows(kb, r, T), _rows(vb, r, T)])
    attn.qkv_proj = _linear(weight, bias)
    o_bias = attn.o_proj.bias
    if o_bias is not None and r != 0:  # added once: by rank 0's partial sum
        o_bias = torch.zeros_like(o_bias.detach())
    attn.o_proj = _linear(_rows(attn.o_proj.weight.detach(), r, T, dim=1),
                          None if o_bias is None else o_bias.detach())
    attn.o_proj.register_forward_hook(_all_reduce_output(group))
    if attn.sinks is not None:
        attn.sinks = nn.Parameter(_rows(attn.sinks.detach(), r, T), requires_grad=False)
    attn.n_heads, attn.n_kv_heads = H // T, G // T


def shard_mla(attn: nn.Module, group: RankGroup) -> None:
    """MLA by heads: the query projection (`q_proj`, or `q_b_proj` after the replicated `q_a_proj`
    and its norm) and `kv_b_proj` (each head's W_UK and W_UV rows) column-parallel, `o_proj`
    row-parallel. `kv_a_proj` and its norm are replicated: every rank computes and caches the whole
    latent row of each token (as vLLM does for MLA under TP), and absorbs its own heads' W_UK / W_UV."""
    r, T = group.rank, group.size
    if attn.q_proj is not None:
        attn.q_proj = _linear(_rows(attn.q_proj.weight.detach(), r, T), None)
    else:
        attn.q_b_proj = _linear(_rows(attn.q_b_proj.weight.detach(), r, T), None)
    attn.kv_b_proj = _linear(_rows(attn.kv_b_proj.weight.detach(), r, T), None)
    attn.o_proj = _linear(_rows(attn.o_proj.weight.detach(), r, T, dim=1), None)
    attn.o_proj.register_forward_hook(_all_reduce_output(group))
    attn.n_heads //= T


def shard_swiglu(ffn: nn.Module, group: RankGroup) -> None:
    """gate/up column-parallel, down row-parallel (its partial sum completed by the FFN's all-reduce)."""
    r, T = group.rank, group.size
    ffn.gate_proj = _linear(_rows(ffn.gate_proj.weight.detach(), r, T), None)
    ffn.up_proj = _linear(_rows(ffn.up_proj.weight.detach(), r, T), None)
    ffn.down_proj = _linear(_rows(ffn.down_proj.weight.detach(), r, T, dim=1), None)


class HiddenShardedExperts(SwiGLUExperts):
    """Every expert with this rank's slice of its hidden units (gate and up rows, down columns):
    the configured dispatch runs unchanged on [E, 2H/T, D] / [E, D, H/T]; the output is a partial sum."""

    def __init__(self, full: SwiGLUExperts, rank: int, size: int):
        nn.Module.__init__(self)
        h = full.hidden // size
        self.n_experts, self.d_model, self.hidden = full.n_experts, full.d_model, h
        self.dispatch_name, self.dispatch = full.dispatch_name, full.dispatch
        gate, up = full.gate_up_proj.detach().split(full.hidden, dim=1)
        self.gate_up_proj = nn.Parameter(torch.cat([_rows(gate, rank, size, 1), _rows(up, rank, size, 1)], dim=1),
                                         requires_grad=False)
        self.down_proj = nn.Parameter(_rows(full.down_proj.detach(), rank, size, 2), requires_grad=False)


class PlacedExperts(SwiGLUExperts):
    """This rank's E/T whole experts (global ids lo..lo+E/T-1). Assignments to other ranks'
    experts are marked dropped (local id E/T, which every dispatch skips): the output is this
    rank's share of each token's expert mix, completed by the FFN's all-reduce."""

    def __init__(self, full: SwiGLUExperts, rank: int, size: int):
        nn.Module.__init__(self)
        self.n_local = full.n_experts // size
        self.lo = rank * self.n_local
        self.n_experts, self.d_model, self.hidden = self.n_local, full.d_model, full.hidden
        self.dispatch_name, self.dispatch = full.dispatch_name, full.dispatch
        self.gate_up_proj = nn.Parameter(_rows(full.gate_up_proj.detach(), rank, size), requires_grad=False)
        self.down_proj = nn.Parameter(_rows(full.down_proj.detach(), rank, size), requires_grad=False)

    def forward(self, x_TD: torch.Tensor, experts_TK: torch.Tensor, weights_TK: torch.Tensor) -> torch.Tensor:
        local_TK = experts_TK - self.lo
        mine_TK = (local_TK >= 0) & (local_TK < self.n_local)
        local_TK = torch.where(mine_TK, local_TK, torch.full_like(local_TK, self.n_local))
        return self.dispatch(x_TD, local_TK, weights_TK, self.gate_up_proj, self.down_proj)


class VocabParallelEmbedding(nn.Module):
    """Rows lo..lo+n of the zero-padded embedding; ids outside give zeros, the all-reduce fills them."""

    def __init__(self, weight: torch.Tensor, lo: int, group: RankGroup):
        super().__init__()
        self.weight, self.lo, self.group = weight, lo, group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.lo
        mine = (local >= 0) & (local < self.weight.shape[0])
        x = F.embedding(torch.where(mine, local, torch.zeros_like(local)), self.weight)
        return self.group.all_reduce(x * mine.unsqueeze(-1).to(x.dtype))


class VocabParallelHead(nn.Module):
    """This rank's logits columns; all-gathered along the vocabulary and cut to `vocab_size`."""

    def __init__(self, weight: torch.Tensor, vocab_size: int, group: RankGroup):
        super().__init__()
        self.weight, self.vocab_size, self.group = weight, vocab_size, group

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.group.all_gather_last(F.linear(h, self.weight))[..., :self.vocab_size]


def shard_vocab(model: nn.Module, group: RankGroup) -> None:
    r, T = group.rank, group.size
    V = model.cfg.vocab_size
    n = -(-V // T)  # rows per rank, the vocabulary zero-padded to n * T

    def my_rows(w: torch.Tensor) -> nn.Parameter:
        padded = F.pad(w.detach(), (0, 0, 0, n * T - V))
        return nn.Parameter(padded[r * n:(r + 1) * n].clone(), requires_grad=False)

    tied = model.lm_head.weight is model.embed.weight
    embed_w = my_rows(model.embed.weight)
    head_w = embed_w if tied else my_rows(model.lm_head.weight)
    model.embed = VocabParallelEmbedding(embed_w, r * n, group)
    model.lm_head = VocabParallelHead(head_w, V, group)


def shard_model(model: nn.Module, group: RankGroup, expert_parallel: bool) -> None:
    """Split `model` (already checked by `check_layout`) into this rank's shard, in place. Its
    `cfg` becomes the rank's view (n_heads / T, n_kv_heads / T: what the engine sizes the KV cache
    by); the vocabulary and the expert count stay the model's."""
    T = group.size
    cfg = model.cfg
    for block in model.layers:
        (shard_mla if cfg.attention_kind == "mla" else shard_attention)(block.attn, group)
        ffn = block.ffn
        if block.is_moe:
            make = PlacedExperts if expert_parallel else HiddenShardedExperts
            ffn.experts = make(ffn.experts, group.rank, T)
            if ffn.shared is not None:
                shard_swiglu(ffn.shared, group)
        else:
            shard_swiglu(ffn, group)
        ffn.register_forward_hook(_all_reduce_output(group))
    shard_vocab(model, group)
    model.mtp = None  # MTP modules draft only for speculative decoding, which the parallel engine refuses
    # (MLA: the cache is the latent, one row per token on every rank, whatever n_kv_heads says)
    model.cfg = dataclasses.replace(cfg, n_heads=cfg.n_heads // T, n_kv_heads=max(cfg.n_kv_heads // T, 1),
                                    head_dim=cfg.resolved_head_dim)
