"""Routing probes: how training-time routing differs from inference, and how stable it is.

Two metrics, for every router variant:

* train/inference overlap (`moe/train_eval_overlap`, and `moe/layer{i}/...`): the fraction
  of tokens whose selected expert SET in training mode (jitter, capacity drops, biases,
  Sinkhorn balancing, expert choice) equals the set in eval mode, on the same router
  input. 1.0 means the model is served exactly as it was trained.
* routing stability (`moe/routing_stability`): the fraction of tokens of a fixed probe
  batch whose eval-mode top-k set is the same at two checkpoints (e.g. two validations).

How: forward hooks on every MoE layer's router capture its input (and its eval-mode
output) during one `no_grad` eval-mode forward of the model; then each router is called
again in training mode on its captured input. The training-mode calls run inside
`torch.random.fork_rng`, so they draw jitter noise from a copy of the RNG state and the
training RNG stream is exactly what it would be without the probe. Eval mode and
`no_grad` also mean stateful routers do not count these forwards (aux_free's load counts).
The model's train/eval mode is restored afterwards.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch
from torch import nn

from moe.routing.routers import Router


def selection_mask(experts_TK: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Bool [T, E]: True where the expert is among the token's assignments (sentinel ids,
    i.e. dropped or unchosen slots, are ignored). Two tokens' sets are equal iff rows are."""
    T = experts_TK.shape[0]
    mask = torch.zeros(T, n_experts + 1, dtype=torch.bool, device=experts_TK.device)
    mask.scatter_(1, experts_TK.long(), True)
    return mask[:, :n_experts]


def moe_routers(model: nn.Module) -> list[Router]:
    """The routers of the model's MoE layers, in layer order (not the multi-token-prediction
    modules' of moe/mtp.py: they run only in a forward with targets, the probes' is without)."""
    return [m for name, m in model.named_modules() if isinstance(m, Router) and "mtp" not in name.split(".")]


@contextlib.contextmanager
def _fork_rng_of(device: torch.device):
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        yield


@torch.no_grad()
def capture_routing(model: nn.Module, input_ids: torch.Tensor, autocast: Optional[Callable] = None):
    """Run one eval-mode forward and return, per MoE layer, `(args, kwargs, out)`: the
    router's inputs (`x_TD`, `token_ids_T`, ...) and its eval-mode `RouterOutput`."""
    routers = moe_routers(model)
    captured: list = [None] * len(routers)

    def hook(i):
        def fn(module, args, kwargs, out):
            captured[i] = (tuple(a.detach() if torch.is_tensor(a) else a for a in args), dict(kwargs), out)
        return fn

    handles = [r.register_forward_hook(hook(i), with_kwargs=True) for i, r in enumerate(routers)]
    was_training = model.training
    model.eval()
    try:
        with (autocast() if autocast else contextlib.nullcontext()):
            model(input_ids)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return captured


@torch.no_grad()
def eval_selections(model: nn.Module, input_ids: torch.Tensor, autocast: Optional[Callable] = None
                    ) -> list[torch.Tensor]:
    """Per MoE layer, the eval-mode selection masks [T, E] (bool, on CPU) of `input_ids`."""
    routers = moe_routers(model)
    return [selection_mask(out.experts_TK, r.n_experts).cpu()
            for r, (_, _, out) in zip(routers, capture_routing(model, input_ids, autocast))]


@torch.no_grad()
def train_eval_overlap(model: nn.Module, input_ids: torch.Tensor, autocast: Optional[Callable] = None) -> dict:
    """`{"moe/train_eval_overlap": mean, "moe/layer{i}/train_eval_overlap": ...}`: per MoE
    layer, the fraction of tokens whose training-mode expert set equals the eval-mode set
    on the same router input. Consumes no RNG and changes no model state."""
    routers = moe_routers(model)
    captured = capture_routing(model, input_ids, autocast)
    out: dict = {}
    values = []
    device = input_ids.device
    with _fork_rng_of(device), (autocast() if autocast else contextlib.nullcontext()):
        for i, (router, (args, kwargs, eval_out)) in enumerate(zip(routers, captured)):
            was_training = router.training
            router.train()
            try:
                train_out = router(*args, **kwargs)
            finally:
                router.train(was_training)
            same = (selection_mask(train_out.experts_TK, router.n_experts)
                    == selection_mask(eval_out.experts_TK, router.n_experts)).all(dim=-1)
            v = float(same.float().mean())
            out[f"moe/layer{i}/train_eval_overlap"] = v
            values.append(v)
    if values:
        out["moe/train_eval_overlap"] = sum(values) / len(values)
    return out


def routing_stability(previous: list[torch.Tensor], current: list[torch.Tensor]) -> dict:
    """`{"moe/routing_stability": mean, "moe/layer{i}/routing_stability": ...}`: per layer,
    the fraction of probe tokens whose selected expert set is the same in both."""
    if len(previous) != len(current):
        raise ValueError(f"selections of {len(previous)} and {len(current)} MoE layers cannot be compared")
    out: dict = {}
    values = []
    for i, (a, b) in enumerate(zip(previous, current)):
        if a.shape != b.shape:
            raise ValueError(f"layer {i}: selection shapes {tuple(a.shape)} and {tuple(b.shape)} differ "
                             "(not the same probe batch)")
        v = float((a == b).all(dim=-1).float().mean())
        out[f"moe/layer{i}/routing_stability"] = v
        values.append(v)
    if values:
        out["moe/routing_stability"] = sum(values) / len(values)
    return out


class RoutingProbe:
    """The trainer's view: overlap on the current batch at log steps, stability on a fixed
    probe batch at validation steps. The previous selections are kept in memory and in the
    checkpoint (`state_dict`), so a resumed run logs the same stability as an
    uninterrupted one."""

    def __init__(self, model: nn.Module, probe_ids: torch.Tensor, autocast: Optional[Callable] = None):
        self.model, self.probe_ids, self.autocast = model, probe_ids, autocast
        self.previous: Optional[list[torch.Tensor]] = None

    def overlap(self, input_ids: torch.Tensor) -> dict:
        return train_eval_overlap(self.model, input_ids, self.autocast)

    def stability(self) -> dict:
        """Selections on the probe batch now vs at the previous call ({} the first time)."""
        current = eval_selections(self.model, self.probe_ids, self.autocast)
        out = routing_stability(self.previous, current) if self.previous is not None else {}
        self.previous = current
        return out

    def state_dict(self) -> dict:
        return {"previous": self.previous}

    def load_state_dict(self, state: Optional[dict]) -> None:
        self.previous = (state or {}).get("previous")
