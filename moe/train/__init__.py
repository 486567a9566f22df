"""Training: the loop (`moe.train.loop.train`), optimizer and schedule (`moe.train.optim`)."""

from moe.train.loop import train
from moe.train.run_dir import JobInfo

__all__ = ["JobInfo", "train"]
