"""Evaluation tasks, registered by name in `EVAL_TASKS` (`task=<name>`, configs/task/<name>.yaml).

`EVAL_TASKS` imports every module of this package when first asked, so a task registers itself
by existing: a new task is one module in eval/tasks/ and one yaml in configs/task/ (see
eval/__init__.py).
"""

from eval.tasks.base import EVAL_TASKS, EvalContext, EvalTask, SubsetConfig

__all__ = ["EVAL_TASKS", "EvalContext", "EvalTask", "SubsetConfig"]
