"""The engine's device-memory plan: KV cache = budget - weights - peak activations - reserve.

    python -m moe.engine.memory.plan <HF model dir or config.json> --device-memory 141GB --dtype bf16 \
        [--max-num-batched-tokens 2048] [--max-num-seqs 64] [--block-size 16] [--reserve 5%] \
        [--quant none|auto|mxfp4|int8|int4|fp8|...] [--kv-groups engine|per-group]

prints the plan of any model of a registered family without a GPU and without loading a weight,
in a few seconds (most of it importing torch): the model is built on the meta device and its
weights counted (parameters x dtype size), and the peak activations of one forward at
`max_num_batched_tokens` tokens come from a formula over the config
(moe.engine.memory.activation_formula: an upper bound of the meta-tensor estimate of
moe.engine.memory.memory_profile, which costs seconds more). On a GPU the engine measures the
forward instead (`moe.engine.memory.cache_size`) and logs the plan.
The reserve (default 5% of the device, at least 1 GiB) covers what neither counts: the CUDA
context, cuBLAS / NCCL workspaces and allocator fragmentation.
`--quant` counts quantized weights at their stored bytes (moe.engine.memory.plan_quant);
the KV of one sequence is counted per group of layers, window layers at the blocks their window
holds (moe.engine.memory.plan_groups; `--kv-groups` says whether a hybrid model is counted as the
engine at this commit frees it or with per-group block tables).
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import torch

from moe import cli
from moe.config.schema import ModelConfig
from moe.dtypes import resolve_dtype
from moe.engine.config import EngineConfig
from moe.engine.memory.activation_formula import peak_activation_bytes
from moe.engine.memory.kv_groups import engine_window
from moe.engine.memory.memory_profile import MemoryPlan, default_reserve
from moe.engine.memory.plan_groups import ACCOUNTINGS, ENGINE, KVGroupsPlan, kv_groups_plan
from moe.engine.memory.plan_offload import offload_lines, plan_with_expert_cache
from moe.engine.memory.plan_parallel import parallel_report, report_json, report_lines
from moe.engine.memory.plan_quant import planned_model, quant_choices, quant_lines, resolve_quant, shipped_method
from moe.engine.runner.context import KVLayout, PagedKVContext
from moe.errors import ConfigError
# moe.hf.families, not moe.hf.convert: the converter imports transformers' modeling code, which
# alone takes seconds; reading a config needs only transformers' config classes.
from moe.hf.families import FAMILIES, family
from moe.hf.io import read_hf_config
from moe.quant import NONE, weight_bytes

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
          "gib": 2**30, "tib": 2**40}


SIZE_FORMS = "a number with a unit, e.g. 141GB, 80GiB, 512MiB or 1.5e9B"
EXIT_DOES_NOT_FIT = 1  # the plan was made, and the model does not fit: scripts can test for it


def parse_bytes(text: str, field: str = "--device-memory") -> int:
    """'141GB' (10^9), '80GiB' (2^30), '512MiB', '1.5e9B' -> bytes. A bare number is refused: `80`
    meant as 80 GB would otherwise be read as 80 bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is not None and unit == "":
        raise ConfigError(f"{field}={text!r} has no unit; write {SIZE_FORMS} (GB = 10^9 bytes, GiB = 2^30)")
    if m is None or unit not in _UNITS:
        raise ConfigError(f"{field}={text!r} is not a size; write {SIZE_FORMS}")
    try:
        return int(float(m.group(1)) * _UNITS[unit])
    except ValueError:
        raise ConfigError(f"{field}={text!r} is not a size; write {SIZE_FORMS}") from None


def plan_model(cfg: ModelConfig, device_memory: int, dtype: torch.dtype, max_num_batched_tokens: int,
               max_num_seqs: int, block_size: int = 16, reserve: Optional[int] = None,
               kv_cache_dtype: str = "auto", max_model_len: Optional[int] = None, quant: str = NONE) -> MemoryPlan:
    """The plan of a model of `cfg`, built on the meta device (no memory, no weights read), its
    weights quantized per `quant` (moe.engine.memory.plan_quant)."""
    model = planned_model(cfg, dtype, quant)
    weights = weight_bytes(model)["total"]
    activations = peak_activation_bytes(model.cfg, max_num_batched_tokens, max_num_seqs, model.embed.weight.element_size())
    per_block = PagedKVContext.model_bytes_per_block(cfg, block_size, dtype, kv_cache_dtype)
    return MemoryPlan(device_memory, weights, activations,
                      default_reserve(device_memory) if reserve is None else reserve, per_block, block_size,
                      max_num_batched_tokens, max_model_len or cfg.max_seq_len, sliding_window=engine_window(cfg))


def groups_of(cfg: ModelConfig, plan: MemoryPlan, dtype: torch.dtype, kv_cache_dtype: str = "auto",
              accounting: str = ENGINE) -> KVGroupsPlan:
    """One sequence's KV per group (moe.engine.memory.plan_groups) of the single-device `plan`."""
    lay = KVLayout.of(cfg)

    def per_block(n_layers: int) -> int:
        return PagedKVContext.bytes_per_block(n_layers, plan.block_size, lay.n_kv_heads, lay.head_dim, dtype,
                                              kv_cache_dtype, lay.latent)
    return kv_groups_plan(cfg, per_block, plan.block_size, plan.max_model_len, plan.max_num_batched_tokens,
                          accounting)


def read_model_config(path: str) -> ModelConfig:
    """The ModelConfig of an HF model directory or of an HF config.json file."""
    p = Path(path).expanduser()
    if p.is_file():
        with tempfile.TemporaryDirectory() as d:  # read_hf_config reads a directory's config.json
            (Path(d) / "config.json").write_text(p.read_text())
            return _model_config(read_hf_config(d))
    return _model_config(read_hf_config(p))


def _model_config(hf_config) -> ModelConfig:
    assert hf_config.model_type in FAMILIES  # read_hf_config refused the others
    return family(hf_config.model_type).model_config(hf_config, attention="sdpa", experts="sorted")


@cli.guarded
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moe.engine.memory.plan", description=__doc__.splitlines()[0])
    ap.add_argument("model", help="an HF model directory or its config.json (no weights are read)")
    ap.add_argument("--device-memory", required=True, help="the device's memory, e.g. 141GB or 80GiB")
    ap.add_argument("--dtype", default="bf16", help="weights, activations and KV cache dtype (default bf16)")
    d = EngineConfig()
    ap.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    ap.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="logits rows of a step")
    ap.add_argument("--block-size", type=int, default=d.block_size)
    ap.add_argument("--kv-cache-dtype", default="auto", help="auto | fp8_e4m3")
    ap.add_argument("--max-model-len", type=int, default=None, help="default: the model's max_seq_len")
    ap.add_argument("--reserve", default=None, help="default: 5%% of the device memory, at least 1 GiB")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    ap.add_argument("--expert-cache", default=None, help="plan with expert offloading: N experts per MoE layer, "
                    "a size (8GB) or a JSON object of expert_cache options (moe/engine/memory/plan_offload.py)")
    ap.add_argument("--devices", type=int, default=None,
                    help="plan a tensor-parallel engine over N devices: per-rank budget for TP and EP layouts and "
                         "the smallest N that serves the model (moe/engine/memory/plan_parallel.py)")
    ap.add_argument("--quant", default=NONE, help=f"weights' quantization, one of {quant_choices()}: "
                    "quantized weights at the scheme's stored bytes, the rest at --dtype; auto: the config's "
                    "quantization_config (GPT-OSS: mxfp4 experts) (moe/engine/memory/plan_quant.py)")
    ap.add_argument("--kv-groups", default=ENGINE, help=f"one of {list(ACCOUNTINGS)}: count a hybrid model's KV as "
                    "the engine at this commit frees it, or with per-group block tables (window layers at their "
                    "window; moe/engine/memory/plan_groups.py)")
    args = ap.parse_args(argv)
    EngineConfig(max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                 block_size=args.block_size, kv_cache_dtype=args.kv_cache_dtype)  # checks the engine options
    memory = parse_bytes(args.device_memory)  # the options first, then the model's config
    reserve = None if args.reserve is None else parse_bytes(args.reserve, "--reserve")
    dtype = resolve_dtype(args.dtype)
    if args.kv_groups not in ACCOUNTINGS:
        raise ConfigError(f"--kv-groups={args.kv_groups!r} is unknown; choose one of {list(ACCOUNTINGS)}")
    quant = resolve_quant(args.quant, args.model)
    cfg = read_model_config(args.model)
    if args.devices is not None:
        return plan_devices(args, cfg, memory, reserve, dtype, quant)
    plan = plan_model(cfg, memory, dtype, args.max_num_batched_tokens, args.max_num_seqs, args.block_size, reserve,
                      args.kv_cache_dtype, args.max_model_len, quant)
    offload: dict = {}
    if args.expert_cache is not None:
        plan, offload = plan_with_expert_cache(plan, cfg, dtype, args.expert_cache, quant)
    groups = groups_of(cfg, plan, dtype, args.kv_cache_dtype, args.kv_groups)
    counted = weight_bytes(planned_model(cfg, dtype, quant)) if quant != NONE else {}
    if args.json:
        print(json.dumps(dict(model=args.model, dtype=args.dtype, quant=quant, fits=groups.fits(plan.kv_cache),
                              **{k: getattr(plan, k) for k in (
            "device_memory", "weights", "activations", "reserve", "kv_cache", "num_blocks", "kv_tokens",
            "max_num_batched_tokens", "max_model_len", "sliding_window", "blocks_per_sequence")},
            sequences=groups.sequences(plan.kv_cache), **groups.as_json(), **offload,
            **{f"weights_{k}": v for k, v in counted.items() if k != "total"})))
    else:
        print(f"plan for {args.model} ({args.dtype}{'' if quant == NONE else ', weights ' + quant}):")
        print("\n".join("  " + line for line in plan_lines(plan, groups)
                        + quant_lines(quant, counted, shipped_method(args.model))
                        + (offload_lines(offload) if offload else [])))
    return 0 if groups.fits(plan.kv_cache) else EXIT_DOES_NOT_FIT


def plan_lines(plan: MemoryPlan, groups: KVGroupsPlan) -> list[str]:
    """The plan's lines with its fit decided by `groups`' counting (the same as the plan's own but
    for a hybrid model counted per group)."""
    lines = [line for line in plan.lines() if not line.startswith("DOES NOT FIT")]
    if groups.hybrid:  # the plan's own "N sequences" counts one table over all layers
        lines = [line.rsplit(", ", 1)[0] + " (sequences: by group, below)" if line.startswith("= KV cache") else line
                 for line in lines]
    lines += groups.lines(plan.kv_cache)
    if not groups.fits(plan.kv_cache):
        lines.append(f"DOES NOT FIT: the cache cannot hold one sequence of max_model_len tokens ({groups.accounting} "
                     "counting)")
    return lines


def plan_devices(args, cfg: ModelConfig, memory: int, reserve: Optional[int], dtype: torch.dtype, quant: str) -> int:
    """`--devices N`: the multi-device plan (exit 1 when neither layout fits N devices)."""
    if args.expert_cache is not None:
        raise ConfigError("--expert-cache is not supported with --devices: the tensor-parallel engine refuses "
                          "expert_cache; plan one of them")
    if quant != NONE:
        raise ConfigError(f"--quant={args.quant} ({quant}) is not supported with --devices: the tensor-parallel engine "
                          "refuses quantized weights (moe/engine/parallel/layout.py); plan one of them")
    if args.devices < 1:
        raise ConfigError(f"--devices={args.devices} must be a positive int")
    report = parallel_report(cfg, args.devices, memory, dtype, dict(
        block_size=args.block_size, max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len, reserve=reserve,
        kv_cache_dtype=args.kv_cache_dtype, kv_groups=args.kv_groups))
    if args.json:
        print(json.dumps(dict(model=args.model, dtype=args.dtype, device_memory=memory, **report_json(report))))
    else:
        print(f"plan for {args.model} ({args.dtype}) over {args.devices} devices:")
        print("\n".join("  " + line for line in report_lines(report)))
    return 0 if any(r["fits"] for r in report.values()) else EXIT_DOES_NOT_FIT


if __name__ == "__main__":
    raise SystemExit(main())
