"""HF directories in and out: `python -m moe.hf export|import`, and `load_any`.

    python -m moe.hf export <checkpoint | run dir> <out_dir> [--dtype fp32|bf16]
    python -m moe.hf import <hf_dir> <out_run_dir> [--attention sdpa] [--experts sorted]

`export` writes a directory that `transformers.AutoModelForCausalLM.from_pretrained(out_dir)`
loads as `MixtralForCausalLM` and `AutoTokenizer.from_pretrained(out_dir)` loads as our
byte-level BPE with its special tokens and chat template:

    config.json, model.safetensors     the Mixtral model (`moe.hf.to_hf_model`)
    generation_config.json             bos <|bos|>, pad <|pad|>, eos [<|eos|>, <|end|>] (a chat turn ends with <|end|>)
    tokenizer.json, tokenizer_config.json   our tokenizer (`Tokenizer.save`: chat template, special tokens)
    moe_lab.json                       provenance: source checkpoint, step, our full resolved config

Variants Mixtral cannot express (shared experts, dense layers, non-softmax or
capacity-limited routers, ...) are refused with a ConfigError naming the option
(`moe.hf.check_mixtral_compatible`).

`import` turns a Mixtral-architecture HF directory (ours or any other `MixtralForCausalLM`
checkpoint that transformers can load) into a moe-lab run directory
(`<out>/checkpoints/step_XXXXXXX.pt`, `config.json`, `tokenizer/`) that `load_model` reads.
`load_any(path)` loads either kind directly, so evaluation and inference need no import step.
A tokenizer that is not a moe-lab tokenizer (its special tokens are not ours at ids 0..6)
is wrapped in `HFTokenizer`, which has the interface of `moe.data.Tokenizer` that the engine
and the evaluations use.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from moe.checkpoint import (CheckpointError, checkpoint_path, load_model, read_checkpoint, resolve_checkpoint,
                            save_checkpoint, tokenizer_files)
from moe.config import Config, ConfigError, from_dict, to_dict

log = logging.getLogger("moe")

PROVENANCE_FILE = "moe_lab.json"
_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
           "fp16": torch.float16, "float16": torch.float16}


def _dtype(name: Any) -> Optional[torch.dtype]:
    if name is None or isinstance(name, torch.dtype):
        return name
    if str(name).lower() not in _DTYPES:
        raise ConfigError(f"dtype={name!r} is not one of {sorted(_DTYPES)}")
    return _DTYPES[str(name).lower()]


# ---------------------------------------------------------------------------- detection

def is_hf_dir(path: Any) -> bool:
    """True for a directory holding an HF `config.json` (one with a `model_type`).

    A moe-lab run directory also has a `config.json` (our resolved config), but without
    `model_type`, so the two are never confused.
    """
    p = Path(os.path.expanduser(str(path)))
    cfg = p / "config.json"
    if not (p.is_dir() and cfg.is_file()):
        return False
    try:
        return "model_type" in json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------------------- tokenizers

class HFTokenizer:
    """A transformers tokenizer behind the `moe.data.Tokenizer` interface (encode without
    special tokens unless `add_bos`, decode, the chat template, special ids)."""

    def __init__(self, tok):
        self.tok = tok

    @classmethod
    def load(cls, path: Any) -> "HFTokenizer":
        from transformers import AutoTokenizer
        return cls(AutoTokenizer.from_pretrained(str(path)))

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(self.tok.encode(text, add_special_tokens=False))
        return [self.bos_id, *ids] if add_bos and self.bos_id is not None else ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        if not getattr(self.tok, "chat_template", None):
            raise ValueError("this tokenizer has no chat template")
        return self.tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)

    def save(self, directory: Any) -> Path:
        self.tok.save_pretrained(str(directory))
        return Path(directory)

    @property
    def vocab_size(self) -> int:
        return len(self.tok)

    @property
    def pad_id(self) -> Optional[int]:
        return self.tok.pad_token_id

    @property
    def bos_id(self) -> Optional[int]:
        return self.tok.bos_token_id

    @property
    def eos_id(self) -> Optional[int]:
        return self.tok.eos_token_id

    @property
    def special_ids(self) -> dict[str, int]:
        return {t: self.tok.convert_tokens_to_ids(t) for t in self.tok.all_special_tokens}

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"HFTokenizer({type(self.tok).__name__}, vocab_size={self.vocab_size})"


def load_tokenizer(path: Any):
    """Our `Tokenizer` when the directory holds a moe-lab tokenizer, else an `HFTokenizer`."""
    from moe.data import Tokenizer

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

def load_hf_dir(path: Any, device: Any = "cpu", dtype: Any = None, eval_mode: bool = True,
                attention: str = "sdpa", experts: str = "sorted"):
    """`(model, tokenizer, cfg)` from a Mixtral-architecture HF directory, like `load_model`.

    The model is loaded by transformers (so any weight layout it understands works, including
    the per-expert w1/w2/w3 layout of the original Mixtral checkpoints) and converted with
    `moe.hf.from_hf_model`; `cfg` is a moe-lab `Config` whose model/router sections come from
    the HF config (and whose other sections come from `moe_lab.json` when we exported it).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from moe.hf import from_hf_model

    p = Path(os.path.expanduser(str(path)))
    if not is_hf_dir(p):
        raise CheckpointError(f"{str(p)!r} is not a Hugging Face model directory (no config.json with a model_type)")
    hf_config = AutoConfig.from_pretrained(str(p))
    if hf_config.model_type != "mixtral":
        raise CheckpointError(f"{str(p)!r} holds a {hf_config.model_type!r} model; only Mixtral-architecture "
                              "models (model_type 'mixtral') convert to moe-lab")
    torch_dtype = _dtype(dtype)
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(str(p), dtype=torch_dtype or "auto")
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"transformers could not load {str(p)!r}: {type(e).__name__}: {e}") from None
    model = from_hf_model(hf_model, attention=attention, experts=experts)
    del hf_model
    model.to(device=device)
    if torch_dtype is not None:
        model.to(dtype=torch_dtype)
    model.train(not eval_mode)

    cfg = Config()
    prov = p / PROVENANCE_FILE
    if prov.is_file():
        try:
            cfg = from_dict(json.loads(prov.read_text())["config"])
        except (KeyError, ValueError, ConfigError) as e:
            log.warning("ignoring %s: %s", prov, e)
            cfg = Config()
    cfg.model, cfg.router = model.cfg, model.router_cfg
    cfg.attention.name, cfg.experts.name = attention, experts
    cfg.train.seq_len = min(cfg.train.seq_len, model.cfg.max_seq_len)  # keep the config valid
    return model, load_tokenizer(p), cfg


def load_any(path: Any, device: Any = "cpu", dtype: Any = None, eval_mode: bool = True):
    """`(model, tokenizer, cfg)` from a moe-lab checkpoint file, run directory, or HF directory."""
    if is_hf_dir(path):
        return load_hf_dir(path, device=device, dtype=dtype, eval_mode=eval_mode)
    return load_model(path, device=device, dtype=_dtype(dtype), eval_mode=eval_mode)


def describe_checkpoint(path: Any) -> dict:
    """What a checkpoint is, for results files: kind, resolved path, step."""
    if is_hf_dir(path):
        p = Path(os.path.expanduser(str(path))).resolve()
        info: dict = {"kind": "hf", "path": str(p), "step": None}
        prov = p / PROVENANCE_FILE
        if prov.is_file():
            try:
                d = json.loads(prov.read_text())
                info.update(step=d.get("step"), exported_from=d.get("source"))
            except ValueError:
                pass
        return info
    ckpt = resolve_checkpoint(path).resolve()
    step = None
    try:
        step = int(ckpt.stem.split("_")[-1])
    except ValueError:
        pass
    return {"kind": "moe-lab", "path": str(ckpt), "run_dir": str(ckpt.parent.parent), "step": step}


# ---------------------------------------------------------------------------- export / import

def export_hf(checkpoint: Any, out_dir: Any, dtype: Any = None) -> Path:
    """Write `checkpoint` (a moe-lab checkpoint or run dir) as an HF Mixtral directory."""
    from transformers import GenerationConfig

    from moe.hf import check_mixtral_compatible, to_hf_model

    src = resolve_checkpoint(checkpoint)
    state = read_checkpoint(src)
    cfg = from_dict(state["config"])
    check_mixtral_compatible(cfg.model, cfg.router)  # refuse before loading anything big
    model, tok, cfg = load_model(src, dtype=_dtype(dtype))
    if tok is None:
        raise CheckpointError(f"checkpoint {str(src)!r} has no tokenizer; an HF export needs one")
    special = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}
    hf_model = to_hf_model(model, **special)
    out = Path(os.path.expanduser(str(out_dir)))
    out.mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(str(out))
    tok.save(out)
    end_id = tok.special_ids.get("<|end|>")
    eos = [tok.eos_id] + ([end_id] if end_id is not None else [])
    GenerationConfig(bos_token_id=tok.bos_id, pad_token_id=tok.pad_id, eos_token_id=eos).save_pretrained(str(out))
    (out / PROVENANCE_FILE).write_text(json.dumps(
        {"source": str(src.resolve()), "step": state.get("step"), "config": to_dict(cfg),
         "note": "exported by `python -m moe.hf export`"}, indent=2))
    log.info("exported %s -> %s (MixtralForCausalLM, %s)", src, out, next(hf_model.parameters()).dtype)
    return out


def import_hf(hf_dir: Any, out_dir: Any, attention: str = "sdpa", experts: str = "sorted",
              dtype: Any = None) -> Path:
    """Write a Mixtral HF directory as a moe-lab run directory; returns the checkpoint path."""
    model, tok, cfg = load_hf_dir(hf_dir, dtype=dtype, attention=attention, experts=experts)
    out = Path(os.path.expanduser(str(out_dir)))
    step = 0
    prov = Path(hf_dir) / PROVENANCE_FILE
    if prov.is_file():
        try:
            step = int(json.loads(prov.read_text()).get("step") or 0)
        except (ValueError, TypeError):
            step = 0
    from moe.data import Tokenizer
    state: dict = {"model": model.state_dict(), "config": to_dict(cfg), "step": step,
                   "imported_from": str(Path(hf_dir).resolve())}
    if isinstance(tok, Tokenizer):
        state["tokenizer"] = tokenizer_files(tok)
        tok.save(out / "tokenizer")
    else:
        log.warning("the tokenizer of %s is not a moe-lab tokenizer (special tokens <|pad|> <|bos|> <|eos|> ... "
                    "at ids 0..6), so the imported checkpoint has none; evaluate or serve the HF directory "
                    "itself (moe.hf_io.load_any) to keep it", hf_dir)
    path = save_checkpoint(checkpoint_path(out, step), state)
    (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    log.info("imported %s -> %s", hf_dir, path)
    return path


# ---------------------------------------------------------------------------- CLI

def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe.hf",
                                     description="Convert between moe-lab checkpoints and HF Mixtral directories.")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="moe-lab checkpoint (file or run dir) -> HF Mixtral directory")
    ex.add_argument("checkpoint")
    ex.add_argument("out_dir")
    ex.add_argument("--dtype", default=None, help="cast the weights (fp32 | bf16 | fp16); default: as saved")
    im = sub.add_parser("import", help="HF Mixtral directory -> moe-lab run directory")
    im.add_argument("hf_dir")
    im.add_argument("out_dir")
    im.add_argument("--attention", default="sdpa")
    im.add_argument("--experts", default="sorted")
    im.add_argument("--dtype", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        if args.command == "export":
            out = export_hf(args.checkpoint, args.out_dir, dtype=args.dtype)
            print(f"exported {args.checkpoint} -> {out}")
        else:
            path = import_hf(args.hf_dir, args.out_dir, attention=args.attention, experts=args.experts,
                             dtype=args.dtype)
            print(f"imported {args.hf_dir} -> {path}")
    except (ConfigError, CheckpointError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
