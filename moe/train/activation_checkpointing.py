"""Per-block activation checkpointing (`train.activation_checkpointing`): `none` | `full`.

With `full`, each transformer block keeps only its input for backward; everything it computed
is recomputed when backward reaches it (`torch.utils.checkpoint`, non-reentrant). Activation
memory drops from every intermediate of every block (attention scores/outputs, norms, router
scores, the expert dispatch's gathered rows and hidden activations) to one [B, T, D] input
per block, for about one more forward of compute.

The block's own `forward` is replaced on the instance, not wrapped in a new module: parameter
and buffer names stay exactly what they are (checkpoints, optimizer groups, DDP's ignored EP
parameters, FSDP2 units all see the same model). FSDP2's hooks run around the module call as
before, and it unshards the block's parameters for backward before the recomputation needs them.

The recomputation must not change what training does:
- randomness (router jitter) is replayed: `preserve_rng_state` (the default) restores the
  CPU and CUDA RNG states of the forward;
- state a block updates in its forward (aux_free's `load_counts`, counted in training forwards)
  would be counted twice: the block's buffers are saved before the recomputation and restored
  after it (`context_fn`), so they change once per forward, as without checkpointing;
- evaluation and anything under `torch.no_grad()` run the plain forward (nothing is saved there).
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from moe.errors import ConfigError

MODES = ("none", "full")


@contextlib.contextmanager
def _buffers_unchanged(module: nn.Module):
    """Restore `module`'s buffers on exit: the recomputation replays, it does not count again."""
    saved = [(b, b.detach().clone()) for b in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)


def _checkpointed_forward(block: nn.Module, *args, **kwargs):
    plain_forward = functools.partial(type(block).forward, block)  # the class's, not this instance's
    if not (block.training and torch.is_grad_enabled()):
        return plain_forward(*args, **kwargs)
    return checkpoint(plain_forward, *args, use_reentrant=False,
                      context_fn=lambda: (contextlib.nullcontext(), _buffers_unchanged(block)), **kwargs)


def apply_activation_checkpointing(model: nn.Module, mode: str) -> int:
    """Checkpoint every block of `model.layers` (`mode="full"`); returns how many were wrapped."""
    if mode not in MODES:
        raise ConfigError(f"train.activation_checkpointing={mode!r} is not allowed; choose one of {list(MODES)}")
    if mode == "none":
        return 0
    mtp = getattr(model, "mtp", None)  # multi-token prediction modules (moe/mtp.py): their blocks too
    blocks = [*model.layers, *(m.block for m in mtp.layers)] if mtp is not None else list(model.layers)
    for block in blocks:
        block.forward = functools.partial(_checkpointed_forward, block)  # an instance attribute: names unchanged
    return len(blocks)
