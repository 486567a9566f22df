"""Shared pieces of the evaluations: data locations, errors, statistics, result files, W&B."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import tempfile
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

log = logging.getLogger("moe.eval")

REPO = Path(__file__).resolve().parents[1]
# The read-only shared data next to the repository (../shared/data); MOE_LAB_DATA overrides it.
SHARED_DATA = Path(os.environ.get("MOE_LAB_DATA") or REPO.parent / "shared" / "data")


class EvalError(RuntimeError):
    """A missing file, unusable data or a failed step of an evaluation; the message says which."""


class IncompleteEvalError(EvalError):
    """The evaluation ran, but its numbers must not be taken as they are (judgments that failed
    beyond judge.max_failures, truncated prompts with eval.on_truncation=error). `results` (what
    there is) is still written to results.json, with the message under `incomplete`, and
    `python -m eval` exits with status 1."""

    def __init__(self, message: str, results: Optional[dict] = None):
        super().__init__(message)
        self.results = results


def truncation_report(n_truncated: int, n_total: int, what: str, limit: int, consequence: str,
                      room: Optional[str] = None) -> dict:
    """The record of truncated inputs kept next to the scores, with its warning text (`room`: what
    the limit is, default the model's context)."""
    share = n_truncated / n_total if n_total else 0.0
    room = room or f"the model's {limit}-token context"
    text = (f"{n_truncated} of {n_total} {what} ({share:.0%}) exceed {room} and were left-truncated: "
            f"{consequence}") if n_truncated else ""
    return {"truncated": n_truncated, "total": n_total, "share": share, "limit": limit, "warning": text}


def resolve_path(path: Any, what: str, must_exist: bool = True, kind: str = "any") -> Path:
    """`path` with ~ expanded and made absolute; a clear EvalError when it should exist and does not."""
    p = Path(os.path.expanduser(str(path))).absolute()
    if must_exist:
        if not p.exists():
            raise EvalError(f"{what}: {str(p)!r} does not exist")
        if kind == "dir" and not p.is_dir():
            raise EvalError(f"{what}: {str(p)!r} is not a directory")
        if kind == "file" and not p.is_file():
            raise EvalError(f"{what}: {str(p)!r} is not a file")
    return p


def data_path_or_default(path: Any, default: Path, field: str, kind: str, get_it: str) -> Path:
    """`path` resolved (`resolve_path`), or the default under ../shared/data when `path` is None;
    a missing default is one line naming where it was looked for and `get_it`, the other ways to
    get the data (a local copy through `field=<path>`, the hub)."""
    if path is not None:
        return resolve_path(path, field, kind=kind)
    if not Path(default).exists():
        raise EvalError(f"{field}: the default {str(default)!r} does not exist (the shared data is looked for in "
                        f"../shared/data beside the checkout, or in MOE_LAB_DATA=<dir>); {get_it}")
    return resolve_path(default, field, kind=kind)


# ---------------------------------------------------------------------------- statistics

def shuffle_and_limit(items: list, cfg) -> list:
    """The common tail of every subset selection: the optional seeded shuffle (`eval.shuffle`,
    `eval.seed`), then the first `eval.limit` items; an empty subset is an error."""
    if cfg.shuffle:
        random.Random(cfg.seed).shuffle(items)
    if cfg.limit is not None:
        items = items[:cfg.limit]
    if not items:
        raise EvalError("the subset is empty (check eval.categories / eval.question_ids / eval.limit)")
    return items


def mean(xs: Sequence[float]) -> Optional[float]:
    return float(sum(xs) / len(xs)) if len(xs) else None


def stderr(xs: Sequence[float]) -> Optional[float]:
    """Standard error of the mean, sqrt(sample variance (ddof=1) / n), as lm-evaluation-harness
    reports it (`mean_stderr`); None for fewer than two values."""
    n = len(xs)
    if n < 2:
        return None
    m = sum(xs) / n
    var = sum((x - m) ** 2 for x in xs) / (n - 1)
    return math.sqrt(var / n)


def summarize(values: dict[str, Sequence[float]]) -> dict[str, Optional[float]]:
    """{"name": mean, "name_stderr": stderr} for each named list of per-item scores."""
    out: dict[str, Optional[float]] = {}
    for name, xs in values.items():
        out[name] = mean(xs)
        out[f"{name}_stderr"] = stderr(xs)
    return out


# ---------------------------------------------------------------------------- files

def write_json(path: Path, obj: Any) -> Path:
    """Write JSON atomically (temp file + rename), so a crash never leaves half a results file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False, allow_nan=False, default=_json_default)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _json_default(o: Any):
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------------------- W&B

class EvalLogger:
    """W&B sink for an evaluation (offline unless logger.mode / WANDB_MODE say otherwise):
    the scores go to the run summary, tables to `wandb.Table`s, plots to `wandb.Image`s.
    With `logger=none` every call is a no-op (results.json is always written)."""

    def __init__(self, logger_cfg, run_dir: Path, config: dict, task: str):
        self.run = None
        if logger_cfg.name != "wandb":
            return
        import wandb  # lazy: heavy, and only logger=wandb needs it

        self.wandb = wandb
        mode = os.environ.get("WANDB_MODE") or logger_cfg.mode or "offline"
        self.run = wandb.init(project=logger_cfg.project, dir=str(run_dir), mode=mode, config=config,
                              group=logger_cfg.group, tags=list(logger_cfg.tags or []) + [f"eval={task}"],
                              name=logger_cfg.run_name, job_type="eval")

    def summary(self, values: dict) -> None:
        if self.run is not None:
            self.run.summary.update({k: v for k, v in values.items() if v is not None})

    def table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        if self.run is not None:
            self.run.log({key: self.wandb.Table(columns=list(columns), data=[list(r) for r in rows])})

    def image(self, key: str, path: Path) -> None:
        if self.run is not None:
            self.run.log({key: self.wandb.Image(str(path))})

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
