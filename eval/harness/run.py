"""Harness tasks by name, with one-line errors, and their evaluation on a `moe_lab` model.

`task_manager` indexes the harness's tasks (unless `include_defaults=False`), this package's
local tasks (`tasks/`: TruthfulQA over the repository's data) and the caller's include paths;
`check_task_names` makes an unknown name a ConfigError with the closest known names;
`evaluate` runs `lm_eval.simple_evaluate` on an `LM` object and makes a dataset the harness
cannot reach (offline: HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, or no network) one EvalError line.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from eval.common import EvalError
from moe.errors import ConfigError

LOCAL_TASKS = Path(__file__).resolve().parent / "tasks"  # TruthfulQA MC1/MC2 over $MOE_LAB_DATA
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def task_manager(include_paths: Sequence[str] = (), include_defaults: bool = True):
    from lm_eval.tasks import TaskManager  # lazy: importing the harness's task index is slow

    paths = [str(LOCAL_TASKS)]
    for p in include_paths:
        path = Path(os.path.expanduser(str(p))).absolute()
        if not path.is_dir():
            raise ConfigError(f"eval.include_path: {str(path)!r} is not a directory of task YAMLs")
        paths.append(str(path))
    return TaskManager(include_path=paths, include_defaults=include_defaults)


def check_task_names(manager, names: Sequence[str]) -> None:
    if not names:
        raise ConfigError("eval.tasks is empty; name harness tasks, e.g. eval.tasks=[truthfulqa_mc1_local]")
    known = manager.all_tasks
    unknown = [n for n in names if n not in known and not Path(str(n)).is_file()]
    if unknown:
        hints = {n: difflib.get_close_matches(str(n), known, n=3) for n in unknown}
        said = "; ".join(f"{n!r}" + (f" (did you mean {', '.join(h)}?)" if h else "") for n, h in hints.items())
        raise ConfigError(f"eval.tasks: unknown harness task {said}; `lm_eval ls tasks` lists them, "
                          "eval.include_path adds a directory of task YAMLs")


def _offline() -> list[str]:
    return [v for v in OFFLINE_VARIABLES if os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")]


def _network_failure(e: BaseException) -> Optional[str]:
    """The first line of a 'could not reach the hub' error in `e`'s chain, else None."""
    while e is not None:
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, ConnectionError) or "OfflineModeIsEnabled" in text or "is not cached" in text:
            return text
        e = e.__cause__ or e.__context__
    return None


def evaluate(lm, names: Sequence[str], manager, limit: Optional[float] = None, num_fewshot: Optional[int] = None,
             apply_chat_template: Any = False, fewshot_as_multiturn: Optional[bool] = None, seed: int = 0,
             log_samples: bool = True, gen_kwargs: Optional[dict] = None) -> dict:
    """`lm_eval.simple_evaluate` of `names` on `lm`: its results dict (results, samples, configs...)."""
    import lm_eval  # lazy: heavy

    check_task_names(manager, names)
    multiturn = bool(apply_chat_template) if fewshot_as_multiturn is None else fewshot_as_multiturn
    try:
        return lm_eval.simple_evaluate(model=lm, tasks=list(names), task_manager=manager, limit=limit,
                                       num_fewshot=num_fewshot, apply_chat_template=apply_chat_template,
                                       fewshot_as_multiturn=multiturn, log_samples=log_samples,
                                       gen_kwargs=gen_kwargs, random_seed=seed, numpy_random_seed=seed,
                                       torch_random_seed=seed, fewshot_random_seed=seed)
    except (ConnectionError, FileNotFoundError, OSError) as e:
        why = _network_failure(e)
        if why is None:
            raise
        offline = _offline()
        raise EvalError(f"eval.tasks {list(names)}: a task's dataset is not available locally ({why})"
                        + (f" and {'/'.join(offline)}=1 forbids downloading" if offline else "")
                        + "; use tasks over local files (eval.include_path) or fill the HF datasets cache first") from None
