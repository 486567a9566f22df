"""Evaluation tasks, registered by name in `EVAL_TASKS` (`task=<name>`, configs/task/<name>.yaml).

Every module of this package other than `base` is imported here, so a task registers itself by
existing: a new task is one module in eval/tasks/ and one yaml in configs/task/ (see
eval/__init__.py). Listing the package instead of naming its modules keeps it that way.
"""

from __future__ import annotations

import importlib
import pkgutil

from eval.tasks.base import EVAL_TASKS, EvalContext, EvalTask, SubsetConfig

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["EVAL_TASKS", "EvalContext", "EvalTask", "SubsetConfig"]
