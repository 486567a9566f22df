"""`train.trainable`: train a subset of the parameters (e.g. only the routers of a loaded model).

Globs (`fnmatch`) over parameter names (`layers.3.ffn.router.weight`); a parameter matched by
none is frozen before the model is wrapped for distributed training: `requires_grad=False`, so
it gets no gradient, and the optimizer (which takes only trainable parameters,
`moe/train/optim.py`) holds no state for it. A pattern that matches no parameter is an error
naming it, and so is a set that leaves nothing to train.
"""

from __future__ import annotations

import dataclasses
import logging
from fnmatch import fnmatchcase
from typing import Sequence

from torch import nn

from moe.config import ModelConfig
from moe.errors import ConfigError
from moe.meta import meta_device
from moe.model import Transformer

log = logging.getLogger("moe")


def freeze_except(model: nn.Module, patterns: Sequence[str]) -> tuple[int, int]:
    """Freeze every parameter whose name no pattern matches (none when `patterns` is empty);
    returns (trainable, total) parameter counts. A parameter that is frozen already (hash
    routing's unused gate) stays frozen."""
    named = list(model.named_parameters())
    total = sum(p.numel() for _, p in named)
    if not patterns:
        return sum(p.numel() for _, p in named if p.requires_grad), total
    if not all(isinstance(p, str) and p for p in patterns):
        raise ConfigError(f"train.trainable={list(patterns)!r} must be a list of glob patterns over parameter "
                          "names, e.g. train.trainable='[*router*]'")
    unmatched = [pat for pat in patterns if not any(fnmatchcase(name, pat) for name, _ in named)]
    if unmatched:
        raise ConfigError(f"train.trainable: {unmatched} match no parameter; the names look like "
                          f"{[n for n, _ in named[:2]] + [n for n, _ in named if 'router' in n][:1]} "
                          "(e.g. '*router*', '*.experts.*', 'layers.0.*', 'lm_head.weight')")
    for name, p in named:
        p.requires_grad_(p.requires_grad and any(fnmatchcase(name, pat) for pat in patterns))
    trainable = sum(p.numel() for _, p in named if p.requires_grad)
    if trainable == 0:
        raise ConfigError(f"train.trainable={list(patterns)!r} leaves nothing to train: the parameters it matches "
                          "are not trainable (e.g. hash routing's gate)")
    return trainable, total


def check_patterns(model_cfg: ModelConfig, patterns: Sequence[str]) -> None:
    """`freeze_except`'s refusals before any data work or weight: on a model built on the meta
    device (the names do not depend on the vocabulary, which may still be unknown)."""
    if patterns:
        with meta_device():
            model = Transformer(dataclasses.replace(model_cfg, vocab_size=model_cfg.vocab_size or 64))
        freeze_except(model, patterns)


def apply_trainable(model: nn.Module, patterns: Sequence[str]) -> int:
    """`freeze_except`, with the count logged at start; returns the trainable parameter count."""
    trainable, total = freeze_except(model, patterns)
    if patterns:
        log.info("train.trainable=%s: %s of %s parameters trainable (%.2f%%), the rest frozen", list(patterns),
                 f"{trainable:,}", f"{total:,}", 100.0 * trainable / max(total, 1))
    else:
        log.info("trainable parameters: %s (all)", f"{trainable:,}")
    return trainable
