"""KV cache bytes per token of HF model configs in the engine's layout, against plain multi-head
attention for MLA models, and what sliding-window layers would need if they kept only their window.

    python -m benchmarks.kv_bytes benchmarks/model_configs/deepseek-v2-lite --dtype bf16

Per model (no weights read; the config as `python -m moe.engine.memory.plan` reads it):
- `engine`: `PagedKVContext.model_bytes_per_block / block_size`, what the engine allocates (MLA:
  the latent row, kv_lora_rank + qk_rope_head_dim values per layer).
- MLA only: `mha` = the same model with plain multi-head attention (per head a key of nope + rope
  and a value of v_head_dim), `expanded_padded` = the per-head cache this engine used before the
  latent cache (K and V zero-padded to one width), and the reduction of `engine` against both.
- sliding-window models: `window_layers_at_window` = the bytes a `--context`-token sequence would
  hold per token if each window layer kept only its window (computed only: the engine keeps every
  layer's blocks, see docs/design/model.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from moe import cli  # noqa: E402
from moe.dtypes import resolve_dtype  # noqa: E402
from moe.engine.memory.plan import read_model_config  # noqa: E402
from moe.engine.runner.context import PagedKVContext  # noqa: E402


def model_kv_bytes(cfg, dtype: torch.dtype, block_size: int, context: int) -> dict:
    elt = torch.empty((), dtype=dtype).element_size()
    out = dict(layers=cfg.n_layers, engine=PagedKVContext.model_bytes_per_block(cfg, block_size, dtype) // block_size)
    if cfg.attention_kind == "mla":
        qk, v = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.v_head_dim
        out["mha"] = cfg.n_layers * cfg.n_heads * (qk + v) * elt
        out["expanded_padded"] = PagedKVContext.bytes_per_block(cfg.n_layers, block_size, cfg.n_heads,
                                                                cfg.resolved_head_dim, dtype) // block_size
        out["reduction_vs_mha"] = 1 - out["engine"] / out["mha"]
        out["reduction_vs_expanded_padded"] = 1 - out["engine"] / out["expanded_padded"]
    windows = [cfg.layer_window(i) for i in range(cfg.n_layers)]
    if any(w is not None for w in windows):
        per_layer = out["engine"] / cfg.n_layers
        held = sum(per_layer * (context if w is None else min(w, context)) for w in windows)
        out["window_layers"] = sum(w is not None for w in windows)
        out["context"] = context
        out["window_layers_at_window"] = held / context
    return out


@cli.guarded
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kv_bytes", description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="HF model directories or config.json files")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--context", type=int, default=32768, help="sequence length for the window-layer figure")
    args = ap.parse_args(argv)
    dtype = resolve_dtype(args.dtype)
    for m in args.models:
        print(json.dumps(dict(model=m, dtype=args.dtype, **model_kv_bytes(read_model_config(m), dtype,
                                                                        args.block_size, args.context))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
