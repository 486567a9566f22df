"""The trainer's side of multi-token prediction (moe/mtp.py): the loss coefficient's schedule and
the per-depth losses and accuracies of a logging window (saved in checkpoints, so a resumed run
logs what an uninterrupted one does)."""

from __future__ import annotations

from typing import Optional

import torch

from moe.config import TrainConfig


def mtp_coef_at(tc: TrainConfig, step: int) -> float:
    """lambda for optimizer step `step` (1-based): `mtp_loss_coef` for the first
    `mtp_loss_switch_step` steps, then `mtp_loss_coef_after` (DeepSeek-V3: 0.3, then 0.1)."""
    if tc.mtp_loss_switch_step is not None and step > tc.mtp_loss_switch_step:
        return float(tc.mtp_loss_coef_after)
    return float(tc.mtp_loss_coef)


def mtp_loss(coef: float, losses: list[torch.Tensor]) -> Optional[torch.Tensor]:
    """lambda / D * sum_k CE_k (None without MTP losses). Kept in the graph at lambda 0 too: every
    parameter then still gets a (zero) gradient, as DDP and FSDP expect of a forward's parameters."""
    if not losses:
        return None
    return coef / len(losses) * torch.stack([loss.float() for loss in losses]).sum()


class MTPWindow:
    """Sums of each depth's loss and top-1 accuracy over the steps since the last log step."""

    def __init__(self, depth: int):
        self.depth = depth
        self.loss_sum, self.acc_sum, self.steps = [0.0] * depth, [0.0] * depth, 0

    def add(self, losses: list[float], accuracies: list[float]) -> None:
        if not self.depth:
            return
        self.loss_sum = [a + b for a, b in zip(self.loss_sum, losses)]
        self.acc_sum = [a + b for a, b in zip(self.acc_sum, accuracies)]
        self.steps += 1

    def record(self, coef: float) -> dict:
        """The window's means (`train/mtp{k}_loss`, `train/mtp{k}_acc`, k = 1..D) and lambda; resets."""
        if not self.depth or not self.steps:
            return {}
        out = {"train/mtp_coef": coef}
        for k in range(self.depth):
            out[f"train/mtp{k + 1}_loss"] = self.loss_sum[k] / self.steps
            out[f"train/mtp{k + 1}_acc"] = self.acc_sum[k] / self.steps
        self.__init__(self.depth)
        return out

    def state_dict(self) -> dict:
        return {"loss_sum": list(self.loss_sum), "acc_sum": list(self.acc_sum), "steps": self.steps}

    def load_state_dict(self, d: Optional[dict]) -> None:
        if d:  # None: a checkpoint without MTP (or from before MTP existed)
            self.loss_sum, self.acc_sum, self.steps = list(d["loss_sum"]), list(d["acc_sum"]), d["steps"]
