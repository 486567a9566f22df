"""Hugging Face directories in: tokenizers and models (any family of `moe/hf/families/`).

`load_hf_dir(path)` gives `(model, tokenizer, cfg)` like `moe.load_model` (which calls it for
HF directories). A tokenizer that is not a moe-lab tokenizer (its special tokens are not ours at
ids 0..6) is wrapped in `HFTokenizer`, which has the interface of `moe.data.Tokenizer` that the
engine and the evaluations use. Writing directories out is `moe/hf/commands.py` (`export_hf`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, PretrainedConfig

from moe.config import Config
from moe.data import Tokenizer
from moe.data.hf_tokenizer import HFTokenizer
from moe.dtypes import resolve_dtype
from moe.errors import CheckpointError, ConfigError
from moe.hf.families import FAMILIES, family
from moe.hf.layout import PROVENANCE_FILE, is_hf_dir
from moe.hf.tensor_map import load_route
from moe.meta import meta_device
from moe.model import Transformer
from moe.quant import QuantSpec, quantized_skeleton
from moe.variants import from_dict
from moe.weights import checkpoint_files, load_tensors_into, safetensors_pieces, stored_dtype, stored_tensor_names

log = logging.getLogger("moe")


# ---------------------------------------------------------------------------- tokenizers

def load_tokenizer(path: Any):
    """Our `Tokenizer` when the directory holds a moe-lab tokenizer, else an `HFTokenizer`."""
    p = Path(path)
    if (p / "tokenizer.json").is_file():
        try:
            return Tokenizer.load(p)
        except ValueError:  # not our special tokens: someone else's tokenizer
            pass
    try:
        return HFTokenizer.load(p)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds
        log.warning("no usable tokenizer in %s (%s: %s); prompts must be token ids", p, type(e).__name__, e)
        return None


# ---------------------------------------------------------------------------- loading

# The tokenizer files of an HF directory, kept verbatim by `import` (binary ones as bytes).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model")


def tokenizer_files_of(path: Any) -> dict[str, Any]:
    """{name: text (or bytes)} of the tokenizer files in HF directory `path`."""
    p = Path(path)
    files: dict[str, Any] = {}
    for name in TOKENIZER_FILES:
        f = p / name
        if f.is_file():
            files[name] = f.read_bytes() if name.endswith(".model") else f.read_text(encoding="utf-8")
    return files


def read_hf_config(path: Any) -> PretrainedConfig:
    """The HF config of directory `path` (transformers parses it: defaults, renamed fields)."""
    p = Path(os.path.expanduser(str(path)))
    if not is_hf_dir(p):
        raise CheckpointError(f"{str(p)!r} is not a Hugging Face model directory (no config.json with a model_type)")
    model_type = json.loads((p / "config.json").read_text())["model_type"]
    if model_type not in FAMILIES:
        raise CheckpointError(f"{str(p)!r} holds a {model_type!r} model; moe-lab converts the families "
                              f"{sorted(FAMILIES)}")
    try:
        return AutoConfig.from_pretrained(str(p))
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds
        raise CheckpointError(f"transformers could not read {str(p / 'config.json')!r}: {type(e).__name__}: {e}") \
            from None


def checkpoint_dtype(config: PretrainedConfig, files: list[Path]) -> torch.dtype:
    """The dtype to load in when none is asked: config.json's `dtype` (as transformers'
    `dtype="auto"`), else the stored tensors', else fp32."""
    declared = getattr(config, "dtype", None)
    if isinstance(declared, str):
        declared = getattr(torch, declared, None)
    if isinstance(declared, torch.dtype) and declared.is_floating_point:
        return declared
    return stored_dtype(files) or torch.float32


def load_hf_dir(path: Any, device: Any = "cpu", dtype: Any = None, eval_mode: bool = True,
                attention: str = "sdpa", experts: str = "sorted", quantization: Any = None):
    """`(model, tokenizer, cfg)` from an HF directory of a registered family, like `load_model`.

    The model is built on the meta device and filled shard by shard from the safetensors files
    (`moe.weights.load_tensors_into` over the family's `stored_pieces`, which unpacks GPT-OSS's
    MXFP4 experts; names from `moe/hf/tensor_map.py`), in `dtype` (default: the checkpoint's)
    on `device`: no random init and no second copy. `quantization` (a `moe.quant.QuantSpec` or
    what it takes) in the format the checkpoint stores (GPT-OSS's MXFP4 experts and `mxfp4`) keeps
    the stored tensors as they are (`model.quant_spec` is set); any other is left to the caller
    (`moe.loading.quantize_loaded`, after a full-precision load). `cfg` is a moe-lab
    `Config` whose model section comes from the HF config (and whose other sections come from
    `moe_lab.json` when we exported the directory)."""
    p = Path(os.path.expanduser(str(path)))
    hf_config = read_hf_config(p)
    fam = family(hf_config.model_type)
    model_cfg = fam.model_config(hf_config, attention=attention, experts=experts)
    files = checkpoint_files(p)
    mtp_depth = fam.stored_mtp_depth(hf_config, stored_tensor_names(files))
    if mtp_depth:  # DeepSeek-V3's multi-token-prediction layers, which transformers drops
        model_cfg = dataclasses.replace(model_cfg, mtp_depth=mtp_depth)
    torch_dtype = resolve_dtype(dtype) or checkpoint_dtype(hf_config, files)
    spec = QuantSpec.coerce(quantization)
    kept = spec.enabled and fam.kept_quantization(hf_config, spec)
    route = load_route(model_cfg, fam)
    with meta_device():
        model = Transformer(model_cfg)
        if kept:
            quantized_skeleton(model, spec)
            route = fam.kept_route(route)
    load_tensors_into(model, fam.stored_pieces(safetensors_pieces(files), kept), route, dtype=torch_dtype,
                      device=device)
    model.train(not eval_mode)

    cfg = Config()
    prov = p / PROVENANCE_FILE
    if prov.is_file():
        try:
            cfg = from_dict(json.loads(prov.read_text())["config"])
        except (KeyError, ValueError, ConfigError) as e:
            log.warning("ignoring %s: %s", prov, e)
            cfg = Config()
    cfg.model = model.cfg
    cfg.train.seq_len = min(cfg.train.seq_len, model.cfg.max_seq_len)  # keep the config valid
    return model, load_tokenizer(p), cfg
