"""`train.init_from`: a new run that starts from another model's weights (fine-tuning).

The source is a run directory (its newest checkpoint), a checkpoint file or distributed
checkpoint directory, or an HF directory of a registered family (`moe.loading.read_model_source`).
Only its weights are taken: the optimizer, schedule, data position and step start afresh, in a
new run directory whose `config.json` names the source (`train.init_from`, and the resolved source
in its "run" record). The model config and the tokenizer are the source's.

A `model.*` override on the command line (`JobInfo.overrides`) that differs from the source is
one ConfigError naming the field, except what a fine-tune may change (`FINETUNE_FIELDS`): the
router variant and its options (capacity, loss coefficients, jitter, ...), the attention and
expert-dispatch implementations, `model.max_seq_len` with `model.rope_scaling`, and
`model.init_std` (it initialises only what a new router adds); each change is logged. The model
has no dropout to change. Without overrides (`train()` called directly without a `JobInfo`) the
model section is wholly the source's.

A new router variant (`router=aux_free` on a topk model) keeps the routing options both variants
have (`CARRIED_ROUTER_OPTIONS`: top_k, renormalize, ...), takes the new variant's defaults for the
rest, and its parameters and buffers start from the old router's where name and shape agree (the
gate; `moe.routing.routers.retarget_router`), else as a new router's (aux_free's bias at 0).

On a resume the source is read again for its config (the model section is then compared with the
checkpoint's like any other), but its weights are not: the run continues from its own checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional, Sequence

import torch

from moe.config import Config, ModelConfig, canonical_field, check_context
from moe.errors import CheckpointError, ConfigError
from moe.loading import ModelSource, load_source_weights, read_model_source
from moe.model import Transformer
from moe.routing.routers import ROUTERS, RouterConfig, retarget_router, router_config
from moe.variants import resolve_model

log = logging.getLogger("moe")

# Model fields (and sections) a fine-tune may set differently from the source.
FINETUNE_FIELDS = ("model.router", "model.attention", "model.experts", "model.max_seq_len", "model.rope_scaling",
                   "model.init_std")
# Router options a new variant keeps from the source's router when it has them: how the pretrained
# model routes (how many experts, how their weights combine), not how the old router was trained.
CARRIED_ROUTER_OPTIONS = ("top_k", "renormalize", "temperature", "score_func", "n_groups", "topk_groups")
ALLOWED = "the router (router=<variant>, router.*), attention=, experts=, model.max_seq_len, model.rope_scaling"


def overridden_model_fields(overrides: Sequence[str]) -> list[str]:
    """The model fields and sections a command line sets, as schema paths: `router=aux_free` ->
    `model.router`, `router.top_k=4` -> `model.router.top_k`, `model=small` -> `model`."""
    out = []
    for o in overrides:
        path = canonical_field(o.split("=", 1)[0].lstrip("+~"))
        if path == "model" or path.startswith("model."):
            out.append(path)
    return sorted(set(out))


def merge_router(source: RouterConfig, given: RouterConfig, overridden: Sequence[str]) -> RouterConfig:
    """The run's router: the source's, or (a new variant named on the command line) the new
    variant with the source's `CARRIED_ROUTER_OPTIONS`; then the router options the command line set."""
    renamed = any(p in ("model.router", "model.router.name") for p in overridden) and given.name != source.name
    name = given.name if renamed else source.name
    own = set(ROUTERS.option_names(name))
    options = {k: v for k, v in dataclasses.asdict(source).items()
               if k in own and (not renamed or k in CARRIED_ROUTER_OPTIONS)}
    for path in overridden:
        key = path.split(".")[2] if path.count(".") >= 2 else None
        if key not in (None, "name"):
            options[key] = getattr(given, key)
    return router_config(name, **options)


def merge_model(source: ModelConfig, given: ModelConfig, overridden: Sequence[str], origin: str) -> tuple[ModelConfig,
                                                                                                          list[str]]:
    """The run's model config: the source's, with the fine-tune changes the command line asked
    for (`overridden`); any other overridden field that differs from the source is a ConfigError.
    Returns the config and the changes, as lines to log."""
    merged = dataclasses.replace(source, attention=given.attention, experts=given.experts)
    changes = []
    for path in overridden:
        if path == "model":
            raise ConfigError(f"model=<preset> chooses a model, but train.init_from={origin!r} gives it; drop the "
                              f"model= choice (a fine-tune may change only {ALLOWED})")
        name = path.split(".")[1]
        new, old = getattr(given, name), getattr(source, name)
        if name in ("router", "attention", "experts") or new == old:
            continue
        if f"model.{name}" not in FINETUNE_FIELDS:
            raise ConfigError(f"model.{name}={new!r} conflicts with train.init_from={origin!r}, whose model has "
                              f"model.{name}={old!r}; the model is the source's, a fine-tune may change only {ALLOWED}")
        merged = dataclasses.replace(merged, **{name: new})
        changes.append(f"model.{name}: {old!r} -> {new!r}")
    merged.router = merge_router(source.router, given.router, [p for p in overridden if p.startswith("model.router")])
    if merged.router != source.router:
        changes.append(f"router: {_router_text(source.router)} -> {_router_text(merged.router)}")
    if merged.dense_layer_ids and merged.dense_hidden is None:
        # The dense FFN's default width follows top_k: pin the source's, so a new top_k changes no shape.
        merged.dense_hidden = source.expert_hidden * source.router.top_k
    return resolve_model(merged), changes


def _router_text(r: RouterConfig) -> str:
    return f"{r.name}({', '.join(f'{k}={v!r}' for k, v in dataclasses.asdict(r).items())})"


def prepare_init_from(cfg: Config, overrides: Sequence[str]) -> tuple[Config, Optional[ModelSource]]:
    """`cfg` with the source's model section (and the allowed changes), and the source; `cfg`
    and None without `train.init_from`. Reads configs and the tokenizer only, never weights."""
    origin = cfg.train.init_from
    if not origin:
        return cfg, None
    try:
        source = read_model_source(origin)
    except CheckpointError as e:
        raise CheckpointError(f"train.init_from={origin!r}: {e}") from None
    except ConfigError as e:  # an HF config the converter refuses (a field our model cannot reproduce)
        raise ConfigError(f"train.init_from={origin!r}: {e}") from None
    if source.tokenizer is None:
        raise CheckpointError(f"train.init_from={origin!r}: no usable tokenizer there; the run tokenises its data "
                              "with the source's tokenizer")
    if source.tokenizer.eos_id is None:
        raise ConfigError(f"train.init_from={origin!r}: its tokenizer has no EOS token, which separates the "
                          "documents of the training data")
    model, changes = merge_model(source.model, cfg.model, overridden_model_fields(overrides), origin)
    check_context("train.seq_len", cfg.train.seq_len, model)
    for change in changes:
        log.info("train.init_from: %s (a fine-tune may change it)", change)
    return dataclasses.replace(cfg, model=model), source


def initial_model(model_cfg: ModelConfig, source: ModelSource, device: Any) -> Transformer:
    """The model a fine-tune starts from: the source's weights in fp32 (the master weights; a
    bf16 run computes under autocast) on `device`, its routers rebuilt when the run changes the
    router (the gate kept where the variant shares its shape)."""
    shaped = dataclasses.replace(model_cfg, router=source.model.router)
    model = load_source_weights(source, shaped, device, torch.float32)
    if model_cfg.router != shaped.router:
        fresh = set()
        for block in model.layers:
            if block.is_moe:
                block.ffn.router, names = retarget_router(block.ffn.router, model_cfg.router, model_cfg.d_model,
                                                          model_cfg.n_experts, model_cfg.init_std)
                fresh.update(names)
        log.info("train.init_from: routers rebuilt as router=%s, the gate kept%s", model_cfg.router.name,
                 f"; new: {sorted(fresh)}" if fresh else "")
    model.cfg = resolve_model(model_cfg)
    log.info("train.init_from: weights of %s (%s%s) loaded in fp32", source.path,
             source.family or "moe-lab checkpoint", f", step {source.step}" if source.step is not None else "")
    return model
