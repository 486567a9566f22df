"""Training: the loop (`moe.train.loop.train`), optimizer and schedule (`moe.train.optim`)."""

from moe.train.loop import train

__all__ = ["train"]
