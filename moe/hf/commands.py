"""`python -m moe.hf export|import`: moe-lab checkpoints <-> Hugging Face directories.

    python -m moe.hf export <checkpoint | run dir> <out_dir> [--family auto|mixtral|olmoe|qwen2_moe|qwen3_moe]
                                                             [--dtype fp32|bf16|fp16] [--max-shard-size 5GB]
    python -m moe.hf import <hf_dir> <out_run_dir> [--attention sdpa] [--experts sorted] [--dtype ...]
                                                   [--quantization mxfp4]

`export` writes a directory that `transformers.AutoModelForCausalLM.from_pretrained(out_dir)`
loads as the family's model and `AutoTokenizer.from_pretrained(out_dir)` loads as the
checkpoint's tokenizer:

    config.json                        the family's HF config (`Family.hf_config`)
    model.safetensors, or model-0000i-of-0000N.safetensors + model.safetensors.index.json
                                       the weights in the published (per-expert) layout, in shards
    generation_config.json             the imported model's, or bos <|bos|>, pad <|pad|>, eos [<|eos|>, <|end|>]
    tokenizer files                    the checkpoint's, verbatim (ours: tokenizer.json + tokenizer_config.json)
    moe_lab.json                       provenance: source checkpoint, step, our full resolved config

`--family auto` is the family the checkpoint was imported from, else the first of mixtral,
qwen3_moe, olmoe, qwen2_moe that can express the model; a family that cannot is refused with a
ConfigError naming the option (`Family.check_expressible`).

`import` turns an HF directory of a registered family into a moe-lab run directory
(`<out>/checkpoints/step_XXXXXXX.pt`, `config.json`, `tokenizer/`) that `load_model` reads. The
checkpoint keeps the HF config, generation config and tokenizer files as they were, so
export -> import -> export writes the same files. `moe.load_model` also reads HF directories
directly, so evaluation and inference need no import step.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from transformers import GenerationConfig

from moe import outputs
from moe.atomic import ordinary_permissions
from moe.checkpoint import checkpoint_path, resolve_checkpoint, save_checkpoint, tokenizer_files
from moe.config import to_dict
from moe.data import Tokenizer
from moe.dtypes import dtype_name
from moe.errors import CheckpointError, ConfigError, UserError
from moe.hf.convert import infer_family
from moe.hf.families import FAMILIES, family
from moe.hf.families.base import BASE_FIELDS
from moe.hf.io import load_hf_dir, read_hf_config, tokenizer_files_of
from moe.hf.layout import PROVENANCE_FILE
from moe.hf.tensor_map import hf_tensors
from moe.loading import load_model, read_any_checkpoint
from moe.variants import from_dict
from moe.weights import save_safetensors

log = logging.getLogger("moe")


# ---------------------------------------------------------------------------- export / import

def _parse_size(size: Any) -> int:
    """Bytes of `5GB`, `500MB`, `2GiB`, or an int."""
    if isinstance(size, int):
        return size
    text = str(size).strip().upper()
    for unit, factor in (("GIB", 2**30), ("MIB", 2**20), ("KIB", 2**10), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3),
                         ("B", 1)):
        if text.endswith(unit):
            try:
                return int(float(text[: -len(unit)]) * factor)
            except ValueError:
                break
    if text.isdigit():
        return int(text)
    raise ConfigError(f"--max-shard-size={size!r} is not a size like 5GB, 500MB or 2GiB")


def claim_output(source: Any, out_dir: Any, overwrite: bool) -> None:
    """Refuse an output directory that is the input, lies in a run's `checkpoints/`, or holds anything
    (unless `overwrite`: then `move_aside` it right before writing); checked before anything is loaded."""
    outputs.refuse_own_input(source, out_dir, "out_dir")
    outputs.refuse_checkpoints_dir(out_dir, "out_dir")
    outputs.check_free(out_dir, "--overwrite", overwrite)


def export_hf(checkpoint: Any, out_dir: Any, dtype: Any = None, model_type: str = "auto",
              max_shard_size: Any = "5GB", overwrite: bool = False) -> Path:
    """Write `checkpoint` (a moe-lab checkpoint or run dir) as an HF directory of family
    `model_type` ("auto": the family it was imported from, else the first that fits). An
    existing, non-empty `out_dir` is refused unless `overwrite`, which moves it aside."""
    claim_output(checkpoint, out_dir, overwrite)
    max_shard_bytes = _parse_size(max_shard_size)
    src = resolve_checkpoint(checkpoint)
    state = read_any_checkpoint(src)
    cfg = from_dict(state["config"])
    hf_info = state.get("hf") or {}
    if model_type == "auto":
        model_type = hf_info.get("model_type") or infer_family(cfg.model)
    fam = family(model_type)
    fam.check_expressible(cfg.model)  # refuse before building anything big
    files = state.get("tokenizer")
    if not files:
        raise CheckpointError(f"checkpoint {str(src)!r} has no tokenizer; an HF export needs one")
    model, tok, cfg = load_model(src, dtype=dtype)
    base = hf_info.get("config") if hf_info.get("model_type") == model_type else None
    special = {} if base else {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}
    config = fam.hf_config(model.cfg, base=base, **special)
    fam.export_quantization(config, getattr(model, "quant_spec", None))
    tensors = hf_tensors(model.state_dict(), model.cfg, fam, "hub")
    weights_dtype = next(model.parameters()).dtype
    config.dtype = weights_dtype
    out = Path(os.path.expanduser(str(out_dir)))
    started = time.time()
    outputs.move_aside(out)
    save_safetensors(tensors, out, max_shard_bytes=max_shard_bytes)
    config.save_pretrained(str(out))
    for name, content in files.items():
        (out / name).write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    if hf_info.get("generation_config"):
        (out / "generation_config.json").write_text(hf_info["generation_config"], encoding="utf-8")
    else:
        end_id = tok.special_ids.get("<|end|>")
        eos = [tok.eos_id] + ([end_id] if end_id is not None else [])
        GenerationConfig(bos_token_id=tok.bos_id, pad_token_id=tok.pad_id, eos_token_id=eos).save_pretrained(str(out))
    (out / PROVENANCE_FILE).write_text(json.dumps(
        {"source": str(src.resolve()), "step": state.get("step"), "config": to_dict(cfg),
         "note": "exported by `python -m moe.hf export`"}, indent=2))
    # safetensors writes the weights owner-only (0600): give the files of this export ordinary permissions.
    ordinary_permissions(*(p for p in out.iterdir() if p.is_file() and p.stat().st_mtime >= started - 1))
    log.info("exported %s -> %s (%s, %s)", src, out, fam.architecture, dtype_name(weights_dtype))
    return out


def import_hf(hf_dir: Any, out_dir: Any, attention: str = "sdpa", experts: str = "sorted",
              dtype: Any = None, overwrite: bool = False, quantization: Any = None) -> Path:
    """Write an HF directory of a registered family as a moe-lab run directory; returns the
    checkpoint path. The HF config, generation config and tokenizer files are kept verbatim. An
    existing, non-empty `out_dir` is refused unless `overwrite`, which moves it aside.
    `quantization="mxfp4"` keeps GPT-OSS's MXFP4 experts as stored (a quantized checkpoint, which
    exports back to the same bytes); otherwise they are dequantised. Other schemes: `python -m moe.quantize`."""
    claim_output(hf_dir, out_dir, overwrite)
    hf_dir = Path(os.path.expanduser(str(hf_dir)))
    model, tok, cfg = load_hf_dir(hf_dir, dtype=dtype, attention=attention, experts=experts, quantization=quantization)
    spec = getattr(model, "quant_spec", None)
    if quantization not in (None, "none") and spec is None:
        raise ConfigError(f"quantization={quantization!r}: {str(hf_dir)!r} does not store its weights in that format "
                          "(import keeps a stored format only: GPT-OSS MXFP4 experts with 'mxfp4'); import it in "
                          "full precision, then `python -m moe.quantize`")
    hf_config = read_hf_config(hf_dir)
    out = Path(os.path.expanduser(str(out_dir)))
    step = 0
    prov = hf_dir / PROVENANCE_FILE
    if prov.is_file():
        try:
            step = int(json.loads(prov.read_text()).get("step") or 0)
        except (ValueError, TypeError):
            step = 0
    gen = hf_dir / "generation_config.json"
    hf_info = {"model_type": hf_config.model_type,
               "config": {k: v for k, v in hf_config.to_dict().items() if k not in BASE_FIELDS},
               "generation_config": gen.read_text(encoding="utf-8") if gen.is_file() else None}
    state: dict = {"model": model.state_dict(), "config": to_dict(cfg), "step": step,
                   "imported_from": str(hf_dir.resolve()), "hf": hf_info}
    if spec is not None:
        state["quantization"] = spec.as_dict()
    files = tokenizer_files(tok) if isinstance(tok, Tokenizer) else tokenizer_files_of(hf_dir)
    outputs.move_aside(out)
    if files:
        state["tokenizer"] = files
        (out / "tokenizer").mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            (out / "tokenizer" / name).write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    else:
        log.warning("%s has no tokenizer files, so the imported checkpoint has none (prompts must be token ids)",
                    hf_dir)
    path = save_checkpoint(checkpoint_path(out, step), state)
    (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    log.info("imported %s (%s) -> %s", hf_dir, hf_config.model_type, path)
    return path


# ---------------------------------------------------------------------------- CLI

def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe.hf",
                                     description="Convert between moe-lab checkpoints and HF model directories "
                                                 f"({', '.join(FAMILIES)}).")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="moe-lab checkpoint (file or run dir) -> HF directory")
    ex.add_argument("checkpoint")
    ex.add_argument("out_dir")
    ex.add_argument("--family", default="auto", help=f"auto | {' | '.join(FAMILIES)} (default: auto)")
    ex.add_argument("--dtype", default=None, help="cast the weights (fp32 | bf16 | fp16); default: as saved")
    ex.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard (default 5GB)")
    ex.add_argument("--overwrite", action="store_true", help="replace an existing out_dir (moved aside to "
                    "<out_dir>.old-<time>, never deleted)")
    im = sub.add_parser("import", help="HF directory -> moe-lab run directory")
    im.add_argument("hf_dir")
    im.add_argument("out_dir")
    im.add_argument("--attention", default="sdpa")
    im.add_argument("--experts", default="sorted")
    im.add_argument("--dtype", default=None)
    im.add_argument("--quantization", default=None, help="mxfp4: keep GPT-OSS's MXFP4 experts as stored "
                    "(default: dequantise them)")
    im.add_argument("--overwrite", action="store_true", help="replace an existing out_dir (moved aside to "
                    "<out_dir>.old-<time>, never deleted)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        if args.command == "export":
            out = export_hf(args.checkpoint, args.out_dir, dtype=args.dtype, model_type=args.family,
                            max_shard_size=args.max_shard_size, overwrite=args.overwrite)
            print(f"exported {args.checkpoint} -> {out}")
        else:
            path = import_hf(args.hf_dir, args.out_dir, attention=args.attention, experts=args.experts,
                             dtype=args.dtype, overwrite=args.overwrite, quantization=args.quantization)
            print(f"imported {args.hf_dir} -> {path}")
    except (UserError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
