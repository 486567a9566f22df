"""Loading a model from anything the codebase writes or reads: `load_model`, `describe_checkpoint`.

One entry point above the three on-disk formats, each owned by its own module:

    a checkpoint file or run directory    moe/checkpoint.py              (the single-file format)
    a distributed checkpoint directory    moe/distributed/checkpoint.py  (torch.distributed.checkpoint)
    a Hugging Face model directory        moe/hf/io.py                   (transformers)

The model is rebuilt from the checkpoint's own resolved config, so loading needs nothing from
the current Hydra setup. `moe.load_model` is this module's `load_model`.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from moe.checkpoint import is_dcp_checkpoint, page_releaser, read_checkpoint, resolve_checkpoint
from moe.config import Config, ModelConfig
from moe.data import Tokenizer
from moe.distributed.checkpoint import read_dcp_checkpoint
from moe.meta import meta_device
from moe.perf import run_dtype
from moe.errors import CheckpointError
from moe.hf.layout import PROVENANCE_FILE, is_hf_dir
from moe.model import Transformer
from moe.quant import QuantSpec, calibration_ids, quantize_model, quantized_skeleton
from moe.routing.options import check_routing
from moe.variants import from_dict
from moe.weights import checkpoint_files, load_safetensors_into, zero_nonpersistent_buffers


def read_any_checkpoint(path: Path, model_only: bool = False) -> dict:
    """A checkpoint file or a distributed checkpoint directory, as one process's full state
    (`model_only`: a DCP directory's optimizer tensors are not read; a file is memory-mapped, so
    what is not used is not read either)."""
    path = Path(path)
    if is_dcp_checkpoint(path):
        return read_dcp_checkpoint(path, model_only=model_only)
    return read_checkpoint(path)


def tokenizer_from_files(files: dict[str, Any]):
    """The tokenizer embedded in a checkpoint: ours (`moe.checkpoint.tokenizer_files`), or the
    files of an imported HF tokenizer (text or bytes), which load as `moe.hf.io.HFTokenizer`."""
    with tempfile.TemporaryDirectory() as d:
        for name, content in files.items():
            (Path(d) / name).write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        try:
            return Tokenizer.load(d)
        except (ValueError, FileNotFoundError):  # not ours: an imported model's own tokenizer
            # Lazy: transformers is an optional heavy dependency (the `hf` extra), needed only here.
            from moe.hf.io import HFTokenizer
            return HFTokenizer.load(d)


def load_model(path: Any, device: Any = "cpu", dtype: Any = None, eval_mode: bool = True,
               routing: Optional[dict] = None, quantization: Any = None):
    """Load `(model, tokenizer, cfg)` from a checkpoint file, a run directory (its newest
    checkpoint), a distributed checkpoint directory or an HF model directory.

    `dtype` casts the weights (a torch dtype, a name: fp32, bf16, fp16, or auto: by device). `routing` changes how
    the loaded model routes, without retraining (`Transformer.set_routing`: `top_k`,
    `drop_experts`, `renormalize`); `cfg.model` is the model's config after the change.
    `quantization` (a scheme name, a dict of `moe.quant.QuantSpec` fields, or a QuantSpec;
    None / "none": as stored) quantizes the loaded model (`moe.quant.quantize_model`); a
    checkpoint written by `python -m moe.quantize` loads quantized by itself.
    """
    # "auto" as every run resolves it (bf16 on CUDA, fp32 on CPU); None keeps the stored dtype
    torch_dtype = None if dtype is None else run_dtype(torch.device(device), dtype)
    spec = QuantSpec.coerce(quantization)
    if is_hf_dir(path):
        # Lazy: transformers is an optional heavy dependency (the `hf` extra), needed only here.
        from moe.hf.io import load_hf_dir
        model, tokenizer, cfg = load_hf_dir(path, device=device, dtype=torch_dtype, eval_mode=eval_mode,
                                            quantization=spec)
        if getattr(model, "quant_spec", None) is None:  # not kept as stored (GPT-OSS MXFP4): quantize it now
            model = quantize_loaded(model, tokenizer, spec)
        return _with_routing(model, tokenizer, cfg, routing)
    ckpt = resolve_checkpoint(path)
    state = read_any_checkpoint(ckpt, model_only=True)
    cfg: Config = from_dict(state["config"])
    stored = QuantSpec.from_record(state.get("quantization"))
    if stored.enabled and spec.enabled and spec.scheme != stored.scheme:
        raise CheckpointError(f"the checkpoint is already quantized ({stored.scheme}); quantization={spec.scheme!r} "
                              "needs the full-precision checkpoint")
    model = _model_from_state(cfg.model, state, ckpt, device, torch_dtype, stored)
    state.pop("optimizer", None)  # (memory-mapped: never read) let it go before anything else is allocated
    model.to(device=device, dtype=torch_dtype)
    if eval_mode:
        model.eval()
    tokenizer = tokenizer_from_files(state["tokenizer"]) if state.get("tokenizer") else None
    if not stored.enabled:
        model = quantize_loaded(model, tokenizer, spec)
    return _with_routing(model, tokenizer, cfg, routing)


def _model_from_state(model_cfg: ModelConfig, state: dict, ckpt: Path, device: Any, dtype: Optional[torch.dtype],
                      stored: Optional[QuantSpec] = None) -> Transformer:
    """A model of `model_cfg` built on the meta device (no random init, no memory), the checkpoint's
    tensors assigned by name (each copied once into `dtype` on `device`)."""
    try:
        with meta_device():
            model = Transformer(model_cfg)
        release = page_releaser(ckpt) if ckpt.is_file() else (lambda t: None)
        if stored is not None and stored.enabled:
            quantized_skeleton(model, stored)
            model.load_state_dict(placed(state["model"], "cpu", None, release), strict=True, assign=True)
        else:
            model.load_state_dict(placed(state["model"], device, dtype, release), strict=True, assign=True)
            if model_cfg.tie_embeddings:  # assign=True gives each name its own Parameter: tie them again
                model.lm_head.weight = model.embed.weight
        zero_nonpersistent_buffers(model, device)
        left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
        if left:
            raise CheckpointError(f"the checkpoint does not hold {left[:5]}")
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint weights do not fit the model its config describes: {e}") from None
    return model


def placed(sd: dict, device: Any, dtype: Optional[torch.dtype], release: Any = lambda t: None) -> dict:
    """Copies of the tensors of a state dict on `device`, floating ones in `dtype` (None: as
    stored), each made once (tensors that shared storage, a tied table, still do); each source
    is dropped from `sd` and its memory-mapped pages given back (`release`, see
    `moe.checkpoint.page_releaser`), so the peak is the loaded model plus one tensor, not it
    plus the file."""
    out, done = {}, {}
    for name in list(sd):
        t = sd.pop(name)
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key not in done:
            want = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
            # Always a copy: the loaded model must not depend on the file staying where it is (a
            # checkpoint pruned or replaced while a CPU server runs; a mapped file gone on NFS is a SIGBUS).
            done[key] = t.to(device=device, dtype=want, copy=True)
            release(t)
        out[name] = done[key]
    return out


def quantize_loaded(model: Transformer, tokenizer, spec: Any) -> Transformer:
    """Quantize a loaded model in place per `spec` (anything `QuantSpec.coerce` takes); AWQ
    encodes its calibration text (`calib_path`) with `tokenizer`."""
    spec = QuantSpec.coerce(spec)
    if not spec.enabled:
        return model
    calib = None
    if spec.build().searches_scales:
        calib = calibration_ids(tokenizer, spec.calib_path, spec.calib_tokens, min(512, model.cfg.max_seq_len))
    return quantize_model(model, spec, calib)


def _with_routing(model: Transformer, tokenizer, cfg: Config, routing: Optional[dict]):
    if routing:
        model.set_routing(**check_routing(routing))
        cfg.model = model.cfg
    return model, tokenizer, cfg


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
    step: Optional[int] = None
    try:
        step = int(ckpt.name.split("_")[-1].split(".")[0])
    except ValueError:
        pass
    return {"kind": "moe-lab", "path": str(ckpt), "run_dir": str(ckpt.parent.parent), "step": step}


# ---------------------------------------------------------------------------- fine-tuning sources

@dataclass
class ModelSource:
    """What a run started from another model (`train.init_from`) reads before any weight: where
    the weights are, the model config they fit and the tokenizer they were trained with."""

    path: Path  # the HF directory, or the checkpoint file / DCP directory (a run directory's newest)
    kind: str  # "hf" | "checkpoint"
    model: ModelConfig
    tokenizer: Any  # moe.data.Tokenizer, moe.hf.io.HFTokenizer, or None (none usable there)
    family: Optional[str] = None  # the HF model_type of an HF directory
    step: Optional[int] = None  # the checkpoint's step
    # The HF family record a checkpoint keeps for `python -m moe.hf export` (as `import` writes it:
    # model_type, the HF config's own fields, generation config), so a fine-tune exports as its family.
    hf: Optional[dict] = None

    def describe(self) -> dict:
        return {"path": str(self.path), "kind": self.kind, "family": self.family, "step": self.step}


def read_model_source(path: Any) -> ModelSource:
    """The `ModelSource` of a run directory, a checkpoint (file or DCP directory) or an HF
    directory of a registered family. A path that holds no model, an HF family moe-lab does not
    convert and a quantized checkpoint (not trainable) are CheckpointErrors saying which."""
    p = Path(os.path.expanduser(str(path)))
    if is_hf_dir(p):
        # Lazy: transformers is an optional heavy dependency (the `hf` extra), needed only here.
        from moe.hf.io import load_tokenizer, read_hf_config  # lazy: transformers
        from moe.hf.families import family
        from moe.hf.families.base import BASE_FIELDS
        hf_config = read_hf_config(p)  # a family moe-lab does not convert: the CheckpointError lists those it does
        model_cfg = family(hf_config.model_type).model_config(hf_config)
        checkpoint_files(p)  # no safetensors weights: the CheckpointError says what is there instead
        gen = p / "generation_config.json"
        hf = {"model_type": hf_config.model_type,
              "config": {k: v for k, v in hf_config.to_dict().items() if k not in BASE_FIELDS},
              "generation_config": gen.read_text(encoding="utf-8") if gen.is_file() else None}
        return ModelSource(p, "hf", model_cfg, load_tokenizer(p), family=hf_config.model_type, hf=hf)
    ckpt = resolve_checkpoint(p)
    state = read_any_checkpoint(ckpt, model_only=True)
    if QuantSpec.coerce(state.get("quantization")).enabled:
        raise CheckpointError(f"{str(ckpt)!r} is quantized ({state['quantization']}); training needs the "
                              "full-precision checkpoint it was made from")
    tokenizer = tokenizer_from_files(state["tokenizer"]) if state.get("tokenizer") else None
    return ModelSource(ckpt, "checkpoint", from_dict(state["config"]).model, tokenizer, step=state.get("step"),
                       hf=state.get("hf"))


def load_source_weights(source: ModelSource, model_cfg: ModelConfig, device: Any,
                        dtype: torch.dtype = torch.float32) -> Transformer:
    """A model of `model_cfg` (the source's shapes; attention, expert dispatch and context may
    differ) holding the source's weights in `dtype` on `device`: built on the meta device and
    filled shard by shard (HF) or tensor by tensor from the memory-mapped file, as `load_model`
    does, so the peak is the model plus one shard. In training mode."""
    if source.kind == "hf":
        # Lazy: transformers (see read_model_source).
        from moe.hf.families import family
        from moe.hf.tensor_map import load_route
        with meta_device():
            model = Transformer(model_cfg)
        load_safetensors_into(model, checkpoint_files(source.path), load_route(model_cfg, family(source.family)),
                              dtype=dtype, device=device)
    else:
        state = read_any_checkpoint(source.path, model_only=True)
        model = _model_from_state(model_cfg, state, source.path, device, dtype)
        del state
        model.to(device=device, dtype=dtype)
    return model.train()
