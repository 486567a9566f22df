"""Dense HF models (Llama, Qwen2, Qwen3, Mistral) as our `Transformer` with every layer dense:
the sources of sparse upcycling (`python -m moe.upcycle`).

Our model already has what these need: a dense SwiGLU FFN per layer (`n_dense_layers = n_layers`,
`dense_hidden = intermediate_size`), q/k/v biases (Qwen2), per-head qk-norm (Qwen3), a separate
head_dim, tied embeddings and the RoPE scalings of `moe/rope.py`; tensor names are the shared table
of `moe/hf/tensor_map.py` (its dense-layer rows). As for the MoE families (`moe/hf/families/`),
every config field is read, ignored with a reason, or refused: sliding-window attention is
refused (ours is full causal attention). These families are not registered in `FAMILIES`: they
have no router, so exporting and the MoE families' checks do not apply to them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, PretrainedConfig

from moe.config import AttentionConfig, ExpertsConfig, ModelConfig, validate_model
from moe.errors import CheckpointError, ConfigError
from moe.hf.families.base import Family, common_input_refusals, common_model_fields
from moe.hf.layout import is_hf_dir
from moe.hf.tensor_map import load_route
from moe.meta import meta_device
from moe.model import Transformer
from moe.routing.routers import router_config
from moe.weights import checkpoint_files, load_safetensors_into, stored_dtype

_SLIDING = "our attention is full causal attention (sliding windows are not supported)"


class DenseFamily(Family):
    """A dense family: the config mapping and refusals; no router, no experts."""

    mapped = frozenset({"intermediate_size", "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window"})
    ignored = {"pretraining_tp": "Llama's tensor-parallel slicing of its matmuls: the same result",
               "max_window_layers": "only read with use_sliding_window, which is refused",
               "layer_types": "every layer is full attention unless use_sliding_window (refused)"}
    qkv_bias_always = False  # Qwen2: biases on q/k/v, none on o_proj, no config field
    qk_norm = "none"

    def input_refusals(self, c) -> list:
        window = getattr(c, "sliding_window", None)
        uses_window = getattr(c, "use_sliding_window", window is not None)
        return [
            (bool(uses_window) and window is not None and window < c.max_position_embeddings, "sliding_window",
             window, _SLIDING),
            (bool(getattr(c, "mlp_bias", False)), "mlp_bias", True, "our dense FFN has no biases"),
        ]

    def dense_config(self, c: PretrainedConfig, attention: str = "sdpa") -> ModelConfig:
        self.check_fields(c)
        for refused, option, value, why in common_input_refusals(c) + self.input_refusals(c):
            if refused:
                raise ConfigError(f"{type(c).__name__}.{option}={value!r} is not supported: {why}")
        bias = bool(getattr(c, "attention_bias", False))
        cfg = ModelConfig(**common_model_fields(c), n_dense_layers=c.num_hidden_layers, dense_hidden=c.intermediate_size,
                          qkv_bias=bias or self.qkv_bias_always, attn_out_bias=bias, qk_norm=self.qk_norm,
                          n_experts=1, router=_placeholder_router(), attention=AttentionConfig(name=attention),
                          experts=ExpertsConfig(name="sorted"))
        validate_model(cfg)
        return cfg


def _placeholder_router():
    """A dense model builds no router; the config still names one (the upcycler replaces it)."""
    return router_config("topk", top_k=1)


class Llama(DenseFamily):
    model_type, display_name = "llama", "Llama"


class Mistral(DenseFamily):
    model_type, display_name = "mistral", "Mistral"


class Qwen2(DenseFamily):
    model_type, display_name = "qwen2", "Qwen2"
    qkv_bias_always = True


class Qwen3(DenseFamily):
    model_type, display_name = "qwen3", "Qwen3"
    qk_norm = "head"


DENSE_FAMILIES: dict[str, type[DenseFamily]] = {f.model_type: f for f in (Llama, Mistral, Qwen2, Qwen3)}


def dense_model_type(path: Any) -> str | None:
    """The model_type of an HF directory of a dense family, else None."""
    p = Path(os.path.expanduser(str(path)))
    if not is_hf_dir(p):
        return None
    model_type = json.loads((p / "config.json").read_text()).get("model_type")
    return model_type if model_type in DENSE_FAMILIES else None


def load_dense_hf(path: Any, dtype: torch.dtype = torch.float32, attention: str = "sdpa") -> Transformer:
    """The dense HF model at `path` as our Transformer (built on meta, filled shard by shard)."""
    p = Path(os.path.expanduser(str(path)))
    model_type = dense_model_type(p)
    if model_type is None:
        raise CheckpointError(f"{str(p)!r} is not an HF directory of a dense family {sorted(DENSE_FAMILIES)}")
    try:
        hf_config = AutoConfig.from_pretrained(str(p))
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds
        raise CheckpointError(f"transformers could not read {str(p / 'config.json')!r}: {type(e).__name__}: {e}") \
            from None
    fam = DENSE_FAMILIES[model_type]()
    cfg = fam.dense_config(hf_config, attention=attention)
    files = checkpoint_files(p)
    with meta_device():
        model = Transformer(cfg)
    load_safetensors_into(model, files, load_route(cfg, fam), dtype=dtype or stored_dtype(files), device="cpu")
    return model.eval()
