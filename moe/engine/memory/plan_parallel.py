"""The planner across devices: `python -m moe.engine.memory.plan <model> --devices N --device-memory 141GB`.

Per rank of a tensor-parallel engine (moe/engine/parallel/shard.py's rules) over N devices:

    weights      attention q/k/v/o projections (MLA: q_b, kv_b, o; its down-projections and norms
                 are replicated), dense and shared FFNs, routed experts (TP: a slice of each
                 expert; EP: N/E whole experts: the same bytes), embedding and LM head (vocab
                 padded to a multiple of N) divided by N; norms and routers replicated; MTP
                 modules dropped (the parallel engine does not draft)
    KV cache     each rank caches its n_kv_heads / N heads; MLA: the whole latent row of every
                 token on every rank (the engine replicates it, vLLM does the same), so a rank's
                 KV bytes per token equal the single device's for any N
    activations  the single-device estimate of one forward at max_num_batched_tokens, kept whole:
                 an upper bound (the residual stream and the gathered logits are replicated, the
                 head and FFN intermediates are not)

and the smallest N (a layout the engine accepts: heads, kv heads, FFN hidden and, with EP,
experts divisible by N; MLA: only n_heads) whose every rank holds the weights and one sequence
of max_model_len (its KV counted per group as `--kv-groups` says: moe/engine/memory/plan_groups.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe.config.schema import ModelConfig
from moe.engine.memory.activation_formula import peak_activation_bytes
from moe.engine.memory.kv_groups import engine_window
from moe.engine.memory.memory_profile import MemoryPlan, default_reserve, gib
from moe.engine.memory.plan_groups import ENGINE, KVGroupsPlan, kv_groups_plan
from moe.engine.parallel.layout import check_divisible
from moe.engine.runner.context import KVLayout, PagedKVContext
from moe.errors import ConfigError
from moe.meta import meta_device
from moe.model import Transformer

MAX_DEVICES = 256  # the smallest-N search stops here
SPLIT_NAMES = ("qkv_proj.", "q_proj.", "q_b_proj.", "kv_b_proj.", "o_proj.", "gate_proj.", "up_proj.", "down_proj.",
               ".experts.", ".sinks")


@dataclass
class ModelBytes:
    """A model's weight bytes by how they split, and its single-device figures."""

    split: int  # divided by N
    vocab_rows: int  # embedding + LM head rows x d_model x bytes: ceil(V / N) rows each per rank
    replicated: int
    activations: int

    def per_rank(self, cfg: ModelConfig, n: int) -> int:
        rows = -(-cfg.vocab_size // n)
        return self.split // n + self.vocab_rows * rows // cfg.vocab_size + self.replicated


def model_bytes(cfg: ModelConfig, dtype: torch.dtype, max_num_batched_tokens: int, max_num_seqs: int) -> ModelBytes:
    with meta_device():
        model = Transformer(cfg).to(dtype).eval()
    split = vocab = replicated = 0
    for name, p in model.named_parameters(remove_duplicate=True):
        b = p.numel() * p.element_size()
        if name.startswith("mtp."):
            continue
        if name in ("embed.weight", "lm_head.weight"):
            vocab += b
        elif any(s in name for s in SPLIT_NAMES):
            split += b
        else:
            replicated += b
    activations = peak_activation_bytes(model.cfg, max_num_batched_tokens, max_num_seqs, model.embed.weight.element_size())
    return ModelBytes(split, vocab, replicated, activations)


def rank_plan(cfg: ModelConfig, sizes: ModelBytes, n: int, device_memory: int, dtype: torch.dtype, block_size: int,
              max_num_batched_tokens: int, max_model_len: int, reserve, kv_cache_dtype: str) -> MemoryPlan:
    per_block = rank_kv_bytes_per_block(cfg, n, block_size, dtype, kv_cache_dtype)
    return MemoryPlan(device_memory, sizes.per_rank(cfg, n), sizes.activations,
                      default_reserve(device_memory) if reserve is None else reserve, per_block, block_size,
                      max_num_batched_tokens, max_model_len, sliding_window=engine_window(cfg))


def rank_kv_bytes_per_block(cfg: ModelConfig, n: int, block_size: int, dtype: torch.dtype,
                            kv_cache_dtype: str = "auto") -> int:
    """One rank's KV bytes per block over `n` ranks: its n_kv_heads / n heads, or MLA's latent
    row whole (moe/engine/parallel/shard.py replicates it; only the query heads split)."""
    lay = KVLayout.of(cfg)
    heads = lay.n_kv_heads if lay.latent else lay.n_kv_heads // n
    return PagedKVContext.bytes_per_block(cfg.n_layers, block_size, heads, lay.head_dim, dtype, kv_cache_dtype,
                                          lay.latent)


def layout_error(cfg: ModelConfig, n: int, expert_parallel: bool):
    try:
        check_divisible(cfg, n, expert_parallel)
    except ConfigError as e:
        return str(e)
    return None


def rank_groups(cfg: ModelConfig, plan: MemoryPlan, n: int, dtype: torch.dtype, kv_cache_dtype: str,
                accounting: str) -> KVGroupsPlan:
    """One sequence's KV per group on one rank of `n` (its kv heads; MLA: the whole latent row)."""
    lay = KVLayout.of(cfg)
    heads = lay.n_kv_heads if lay.latent else lay.n_kv_heads // n

    def per_block(n_layers: int) -> int:
        return PagedKVContext.bytes_per_block(n_layers, plan.block_size, heads, lay.head_dim, dtype, kv_cache_dtype,
                                              lay.latent)
    return kv_groups_plan(cfg, per_block, plan.block_size, plan.max_model_len, plan.max_num_batched_tokens, accounting,
                          tensor_parallel=n > 1)


def parallel_report(cfg: ModelConfig, devices: int, device_memory: int, dtype: torch.dtype, opts: dict) -> dict:
    """{layout: {"devices": N, "valid", "error", "plan" (per rank), "fits", "smallest_devices"}} for TP and EP.
    `opts`: block_size, max_num_batched_tokens, max_num_seqs, max_model_len, reserve, kv_cache_dtype and
    kv_groups (moe.engine.memory.plan_groups: engine | per-group; default engine)."""
    sizes = model_bytes(cfg, dtype, opts["max_num_batched_tokens"], opts["max_num_seqs"])
    max_model_len = opts["max_model_len"] or cfg.max_seq_len

    def plan(n):
        return rank_plan(cfg, sizes, n, device_memory, dtype, opts["block_size"], opts["max_num_batched_tokens"],
                         max_model_len, opts["reserve"], opts["kv_cache_dtype"])

    def kv(n, p):
        return rank_groups(cfg, p, n, dtype, opts["kv_cache_dtype"], opts.get("kv_groups", ENGINE))

    def serves(n):
        p = plan(n)
        return kv(n, p).fits(p.kv_cache)

    out = {}
    for name, ep in (("tp", False), ("ep", True)):
        error = layout_error(cfg, devices, ep)
        here = None if error else plan(devices)
        groups = None if here is None else kv(devices, here)
        smallest = next((n for n in range(1, MAX_DEVICES + 1) if layout_error(cfg, n, ep) is None and serves(n)), None)
        out[name] = dict(devices=devices, valid=error is None, error=error, plan=here, groups=groups,
                         fits=groups is not None and groups.fits(here.kv_cache), smallest_devices=smallest)
    return out


def report_lines(report: dict) -> list[str]:
    lines = []
    for name, r in report.items():
        title = "TP experts (a slice of every expert)" if name == "tp" else "EP experts (whole experts per rank)"
        lines.append(f"{title}, {r['devices']} devices:")
        if not r["valid"]:
            lines.append(f"  not a valid layout: {r['error']}")
        else:
            plan, groups = r["plan"], r["groups"]
            lines += ["  per rank: " + line for line in plan.lines() if not line.startswith("DOES NOT FIT")]
            lines += ["  per rank: " + line for line in groups.lines(plan.kv_cache)]
            if not r["fits"]:
                lines.append(f"  per rank: DOES NOT FIT: one sequence of max_model_len tokens ({groups.accounting} "
                             "counting)")
        smallest = r["smallest_devices"]
        lines.append(f"  smallest number of devices that serves it: {smallest}" if smallest else
                     f"  no layout up to {MAX_DEVICES} devices holds it")
    return lines


def report_json(report: dict) -> dict:
    out = {}
    for name, r in report.items():
        p = r["plan"]
        g = r["groups"]
        out[name] = dict({k: v for k, v in r.items() if k not in ("plan", "groups")},
                         per_rank=None if p is None else dict({k: getattr(p, k) for k in (
                             "weights", "activations", "reserve", "kv_cache", "num_blocks", "kv_tokens")},
                             sequences=g.sequences(p.kv_cache), **g.as_json()),
                         per_rank_gib=None if p is None else {"weights": gib(p.weights), "kv_cache": gib(p.kv_cache)})
    return out
