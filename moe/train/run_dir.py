"""Which run directory a training run writes into, and which checkpoint it resumes from.

Rules (the README's "Resume" and "Run directories" paragraphs; tests/train/test_run_dir.py):

* A fresh run (`train.resume` unset) needs an unused directory: one holding checkpoints or a
  `metrics.jsonl` is refused with one line naming it and the options, unless
  `train.overwrite=true`, which moves the old run into `<dir>/replaced_<time>/` (nothing is deleted).
* `train.resume=auto` resumes its own run: the directory itself when it has a checkpoint; else,
  among the sibling run directories, the newest whose resolved config matches (the fields exempt
  from the resume check, `moe/train/resume.py`, aside); in a Hydra sweep only the job with the
  same overrides under the same sweep directory. Directories without `metrics.jsonl` (an imported
  HF model) are never candidates. Nothing found: a fresh start, said in the log.
* `train.resume=PATH` of its run's newest checkpoint continues that run in its directory; of an
  older one, it branches into the (unused) requested directory, whose `metrics.jsonl` starts with
  the parent's records up to that step and whose `config.json` names the parent checkpoint.

A resumed run writes everything into the resumed run's directory: the console log handlers that
Hydra opened in the new directory are pointed at the resumed one, and the new directory is
removed when it holds nothing but Hydra's files.

A run refused at start (a bad value, a missing data path, a backend this machine lacks, a
resume check) leaves nothing behind: `start_guard` removes what the start created, and
train.py the directory Hydra made for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from moe.checkpoint import checkpoint_step, latest_checkpoint, list_checkpoints, resolve_checkpoint, stale_temp_files
from moe.config import Config, canonical_field, to_dict
from moe.errors import CheckpointError, ConfigError, UserError
from moe.jsonl import read_records, write_json, write_records
from moe.train.resume import matches_field, config_changes
from moe.variants import from_dict

log = logging.getLogger("moe")

METRICS, CONFIG, RUN_KEY = "metrics.jsonl", "config.json", "run"
HYDRA_FILES = (".hydra",)  # what Hydra writes into a run directory before the job starts (plus *.log)
# Overrides that say how to run a job, not which job it is (a sweep job keeps its identity when
# resumed with them); intervals stay part of the identity: a sweep may vary them.
RUN_CONTROL = ("train.resume", "train.resume_allow", "train.overwrite", "train.stop_after", "train.exit_zero_on_signal")


@dataclass
class JobInfo:
    """What the launcher knows about this job: its command-line overrides and whether it is one
    job of a sweep (Hydra multirun). `train()` called directly has neither."""

    overrides: list[str] = field(default_factory=list)
    sweep: bool = False


@dataclass
class RunPlan:
    run_dir: Path  # where this run writes
    checkpoint: Optional[Path] = None  # what it resumes from (None: a fresh start)
    parent: Optional[Path] = None  # a branch's parent checkpoint (resume=PATH of an older checkpoint)


def identity_overrides(overrides: list[str], allow=()) -> list[str]:
    """The overrides that define a sweep job: without Hydra's own, the run-control ones and the
    intended changes of `train.resume_allow`."""
    out = []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key.startswith("hydra.") or matches_field(canonical_field(key), (*RUN_CONTROL, *allow)):
            continue
        out.append(o)
    return sorted(out)


def read_run_config(run_dir: Path) -> tuple[Optional[Config], dict]:
    """(the resolved config in `run_dir/config.json` or None if unreadable, its "run" record)."""
    try:
        d = json.loads((Path(run_dir) / CONFIG).read_text())
        info = d.pop(RUN_KEY, {}) or {}
        return from_dict(d), info
    except (OSError, ValueError, UserError):
        return None, {}


def occupied(run_dir: Path) -> list[str]:
    """What marks `run_dir` as holding a run: its checkpoints and metrics file."""
    run_dir = Path(run_dir)
    found = []
    if list_checkpoints(run_dir) or stale_temp_files(run_dir):
        found.append("checkpoints/")
    if (run_dir / METRICS).exists():
        found.append(METRICS)
    return found


def move_aside(run_dir: Path) -> Path:
    """Move the run in `run_dir` into `run_dir/replaced_<time>/` (Hydra's files stay; the console
    log is copied, since this process appends to it)."""
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    dest = run_dir / f"replaced_{stamp}"
    n = 1
    while dest.exists():
        n += 1
        dest = run_dir / f"replaced_{stamp}_{n}"
    dest.mkdir()
    for p in sorted(run_dir.iterdir()):
        if p == dest or p.name.startswith("replaced_") or p.name in HYDRA_FILES:
            continue
        if p.suffix == ".log":
            shutil.copy2(p, dest / p.name)
        else:
            p.rename(dest / p.name)
    return dest


def _fresh(run_dir: Path, overwrite: bool) -> RunPlan:
    used = occupied(run_dir)
    if used and not overwrite:
        raise ConfigError(
            f"run directory {run_dir} already holds a run ({', '.join(used)}); continue it with "
            "train.resume=auto, write elsewhere with hydra.run.dir=<new dir>, or set train.overwrite=true "
            f"to move the old run into {run_dir}/replaced_<time>/ (nothing is deleted)")
    if used:
        log.warning("train.overwrite=true: moved the previous run of %s into %s", run_dir, move_aside(run_dir))
    return RunPlan(run_dir)


def _resume_path(cfg: Config, requested: Path) -> RunPlan:
    try:
        ckpt = resolve_checkpoint(cfg.train.resume)
    except CheckpointError as e:
        raise CheckpointError(f"train.resume={cfg.train.resume!r}: {e}") from None
    run = ckpt.parent.parent
    step = checkpoint_step(ckpt)
    in_run = ckpt.parent.name == "checkpoints" and step is not None
    if in_run and all((checkpoint_step(c) or 0) <= step for c in list_checkpoints(run)):
        return RunPlan(run, ckpt)  # the run's newest checkpoint: continue that run where it is
    if in_run and requested.resolve() == run.resolve():
        raise ConfigError(f"train.resume={cfg.train.resume!r} is an older checkpoint of this run directory; "
                          "resuming from it branches into a new run: set hydra.run.dir=<new dir>")
    _fresh(requested, cfg.train.overwrite)  # the branch needs an unused directory
    if in_run:  # the branch's history up to the branch point, so its metrics read as one run
        write_records(requested / METRICS, read_records(run / METRICS, max_step=step))
    log.info("train.resume=%s: branching from step %s into %s (%s keeps its metrics and checkpoints)",
             cfg.train.resume, step, requested, run)
    return RunPlan(requested, ckpt, parent=ckpt)


def _matching(cfg: Config, run_dir: Path, job: JobInfo) -> Optional[str]:
    """Why the run in `run_dir` is not this run (None: it is)."""
    saved, info = read_run_config(run_dir)
    if saved is None:
        return f"no readable {CONFIG}"
    allow = [canonical_field(str(a)) for a in cfg.train.resume_allow]
    if job.sweep:
        mine, theirs = identity_overrides(job.overrides, allow), info.get("overrides")
        if theirs is None or identity_overrides(theirs, allow) != mine:
            return f"another sweep job (overrides {theirs})"
    if cfg.model.vocab_size is None:  # resolved from the tokenizer later, as it was for the saved run
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=saved.model.vocab_size))
    refused = [c for c in config_changes(saved, cfg) if not matches_field(c.field, allow)]
    return f"another config ({refused[0]}{' ...' if len(refused) > 1 else ''})" if refused else None


def _resume_auto(cfg: Config, requested: Path, job: JobInfo) -> RunPlan:
    own = latest_checkpoint(requested)
    if own is not None and not (job.sweep and _matching(cfg, requested, job)):
        return RunPlan(requested, own)  # its own run: a config mismatch is an error once the checkpoint is read
    parent = requested.parent
    candidates = [d for d in sorted(parent.iterdir()) if d.is_dir() and d != requested
                  and (d / METRICS).exists() and latest_checkpoint(d) is not None] if parent.is_dir() else []
    found = []
    for d in candidates:
        why = _matching(cfg, d, job)
        if why:
            log.info("train.resume=auto: not resuming %s: %s", d, why)
        else:
            found.append((latest_checkpoint(d).stat().st_mtime, str(d), d))
    if found:
        d = max(found)[2]
        return RunPlan(d, latest_checkpoint(d))
    if occupied(requested) and not _matching(cfg, requested, job):
        # This run stopped before its first checkpoint: start it again, its partial records moved aside.
        log.warning("train.resume=auto: %s has no checkpoint yet; restarting the run from step 0 (the partial "
                    "records are moved into %s)", requested, move_aside(requested))
        return RunPlan(requested)
    log.info("train.resume=auto: no checkpoint of this run (same %s) in %s or its sibling directories; "
             "starting from scratch", "overrides" if job.sweep else "config", requested)
    return _fresh(requested, cfg.train.overwrite)


def plan_run(cfg: Config, requested: Path, job: Optional[JobInfo] = None) -> RunPlan:
    """Decide where the run writes and what it resumes from (on rank 0; see the module docstring)."""
    requested, job = Path(requested), job or JobInfo()
    if cfg.train.resume is None:
        plan = _fresh(requested, cfg.train.overwrite)
    elif cfg.train.resume == "auto":
        plan = _resume_auto(cfg, requested, job)
    else:
        plan = _resume_path(cfg, requested)
    for tmp in stale_temp_files(plan.run_dir):
        log.warning("removing %s: the temp file of a checkpoint save that a crash interrupted", tmp)
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
    return plan


def write_run_config(cfg: Config, plan: RunPlan, job: Optional[JobInfo], step: int, changes: list,
                     init_from: Optional[dict] = None) -> None:
    """`config.json`: the resolved config plus a "run" record (the job's overrides, the parent
    checkpoint of a branch, the model a fine-tune started from (`init_from`: its resolved path,
    kind, family, step), and each resume: step, checkpoint, allowed config changes)."""
    job = job or JobInfo()
    _, info = read_run_config(plan.run_dir) if plan.checkpoint is not None else (None, {})
    source = info.get("init_from") or init_from
    info = {"overrides": info.get("overrides", job.overrides), "parent_checkpoint": info.get("parent_checkpoint"),
            **({"init_from": source} if source else {}), "resumes": info.get("resumes", [])}
    if plan.parent is not None:
        info["parent_checkpoint"] = str(plan.parent)
    if plan.checkpoint is not None:
        info["resumes"].append({"step": step, "checkpoint": str(plan.checkpoint), "overrides": job.overrides,
                                "changes": [str(c) for c in changes]})
    write_json(plan.run_dir / CONFIG, {**to_dict(cfg), RUN_KEY: info})


@contextlib.contextmanager
def start_guard(requested: Path, main: bool = True) -> Iterator[None]:
    """Around a run's start: when it fails (or is interrupted), remove what it created in
    `requested`: the directory itself if it did not exist, else the entries it added (never a
    moved-aside `replaced_*` run, nor Hydra's own files)."""
    requested = Path(requested)
    before = {p.name for p in requested.iterdir()} if requested.is_dir() else None
    try:
        yield
    except BaseException:
        if main and requested.is_dir():
            if before is None:
                shutil.rmtree(requested, ignore_errors=True)
            else:
                for p in requested.iterdir():
                    if p.name not in before and not p.name.startswith("replaced_") and p.name not in HYDRA_FILES \
                            and p.suffix != ".log":
                        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        raise


def _file_handlers(directory: Path) -> list[logging.FileHandler]:
    """The console log files (Hydra's `train.log`) open in `directory`."""
    directory = Path(directory).resolve()
    return [h for lg in (logging.getLogger(), log) for h in lg.handlers
            if isinstance(h, logging.FileHandler) and Path(h.baseFilename).parent == directory]


def log_offsets(directory: Path) -> dict[str, int]:
    """Where each console log file open in `directory` ends now: what this process logs from here
    on is its own (a sweep job's directory may hold another run's log)."""
    out = {}
    for h in _file_handlers(directory):
        h.flush()
        p = Path(h.baseFilename)
        out[h.baseFilename] = p.stat().st_size if p.exists() else 0
    return out


def follow_into(requested: Path, run_dir: Path, offsets: dict[str, int], main: bool = True) -> None:
    """Point the console log files open in `requested` at `run_dir`; the main process also moves
    there what this process logged since `offsets` (`log_offsets` at its start) and deletes
    `requested` when nothing but Hydra's files is left there."""
    requested, run_dir = Path(requested).resolve(), Path(run_dir).resolve()
    if requested == run_dir:
        return
    for h in _file_handlers(requested):
        h.acquire()
        try:
            h.close()
            old, new = Path(h.baseFilename), run_dir / Path(h.baseFilename).name
            start = offsets.get(h.baseFilename, 0)
            if main and old.exists():
                with open(old, "rb") as f:
                    f.seek(start)
                    mine = f.read()
                with open(new, "ab") as f:
                    f.write(mine)
                if start:
                    with open(old, "r+b") as f:
                        f.truncate(start)  # the other run's log, as it was
                else:
                    old.unlink()
            h.baseFilename, h.mode = str(new), "a"  # reopened on the next record
        finally:
            h.release()
    if main and requested.is_dir() and all(p.name in HYDRA_FILES for p in requested.iterdir()):
        shutil.rmtree(requested)  # the console log moved out above; Hydra's config files alone are left
