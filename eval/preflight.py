"""Everything `python -m eval` checks before it creates an output directory or loads anything.

Hydra creates the run directory (and writes `.hydra/` and `eval.log` into it) before the task
function runs, so a refusal found inside the run would leave an empty directory behind, and
"the newest directory under outputs/eval/" would then be a failed one. Hence two steps:

* `preflight(argv)`, before Hydra starts: compose the config as Hydra will, run `check_run`
  (config values, checkpoint path, device, the task's data files and options) and check an
  explicit `hydra.run.dir`; a refusal is one line, exit 2, and no directory exists.
* `run_eval` calls `check_run` and `claim_run_dir` again before it writes (the checks for callers
  that skip the command line); `discard_run_dir` removes what Hydra created when the run is
  refused after all (a checkpoint that exists but does not load).

An output directory that already holds an evaluation is refused unless `eval.overwrite=true`,
which moves the old one aside to `<dir>.old-<time>` (before Hydra runs) or its files to
`<file>.old-<time>` (inside the run); nothing is deleted.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional, Sequence

import torch

from eval.common import EvalError
from eval.config import EvalRunConfig, load_eval_config
from eval.tasks import EVAL_TASKS
from moe import cli, outputs
from moe.errors import CheckpointError, ConfigError, UserError
from moe.loading import describe_checkpoint
from moe.perf import resolve_device

HYDRA_FILES = (".hydra",)  # what Hydra writes into a run directory before the job starts (plus *.log)
OVERWRITE = "eval.overwrite=true"
RESULTS = "results.json"


def check_run(cfg: EvalRunConfig) -> tuple[torch.device, dict]:
    """The checks that need more than the config's values: the checkpoint path, the device, and the
    task's inputs (`EvalTask.check_inputs`). Returns (device, describe_checkpoint's record)."""
    task = EVAL_TASKS.get(cfg.task)()
    try:
        info = describe_checkpoint(cfg.ckpt) if cfg.ckpt is not None else {"kind": None, "path": None, "step": None}
    except CheckpointError as e:
        raise CheckpointError(f"ckpt={cfg.ckpt!r}: {e}") from None
    device = resolve_device(cfg.device, field="device")
    task.check_inputs(cfg)
    if cfg.tensor_parallel_size > 1 and task.needs_model(cfg.eval):
        check_parallel_layout(cfg)
    return device, info


def check_parallel_layout(cfg: EvalRunConfig) -> None:
    """With several ranks, what the engine would refuse once its processes start (heads or experts
    not divisible by T, weights stored quantized), found now from the checkpoint's config alone."""
    from moe.engine.parallel.layout import check_layout, check_not_quantized  # lazy: only for T > 1
    from moe.engine.parallel.shard_load import model_config_of
    try:
        model_cfg, quantized = model_config_of(cfg.ckpt)
    except CheckpointError as e:
        raise CheckpointError(f"ckpt={cfg.ckpt!r}: {e}") from None
    check_layout(model_cfg, cfg.tensor_parallel_size, cfg.expert_parallel)
    check_not_quantized(quantized, cfg.tensor_parallel_size)


def _own(p: Path) -> bool:
    """Whether `p` is one of the files Hydra writes into every run directory."""
    return p.name in HYDRA_FILES or p.suffix == ".log"


def refuse_checkpoint_home(run_dir: Path, ckpt) -> None:
    """An evaluation's own directory never holds checkpoints: not the checkpoint it evaluates (or its run),
    not a training run's `checkpoints/`. With eval.overwrite=true they would be moved aside with the rest."""
    run_dir = outputs.as_path(run_dir).absolute()
    if outputs.holds(run_dir, ckpt):
        what = f"the checkpoint being evaluated (ckpt={str(ckpt)!r})"
    elif (run_dir / outputs.CHECKPOINTS_DIR).exists():
        what = f"a training run's {outputs.CHECKPOINTS_DIR}/"
    else:
        return
    raise ConfigError(f"hydra.run.dir={str(run_dir)!r} holds {what}; an evaluation writes into a directory of its "
                      f"own (e.g. {str(run_dir / 'eval')!r}), whatever eval.overwrite says")


def claim_run_dir(run_dir: Path, overwrite: bool, resumes: bool = False) -> None:
    """Refuse a run directory holding another evaluation's outputs, or with `overwrite` move each
    of them aside; Hydra's own files of this run are left alone. A task that `resumes` continues
    its run there (its earlier results.json is moved aside, the rest is the run's own to extend)."""
    run_dir = Path(run_dir)
    old = sorted(p for p in run_dir.iterdir() if not _own(p)) if run_dir.is_dir() else []
    if old and resumes and not overwrite:
        outputs.move_aside(run_dir / RESULTS)
        return
    if old and not overwrite:
        raise ConfigError(f"{run_dir} already holds an evaluation ({', '.join(p.name for p in old[:4])}); choose "
                          f"another hydra.run.dir, or add {OVERWRITE} to move its files aside (to "
                          "<name>.old-<time>; nothing is deleted)")
    for p in old:
        outputs.move_aside(p)


def discard_run_dir(run_dir: Path) -> None:
    """Remove `run_dir` when it holds nothing but Hydra's files: what a refused run created."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not all(_own(p) for p in run_dir.iterdir()):
        return
    shutil.rmtree(run_dir, ignore_errors=True)


def _explicit_run_dir(overrides: Sequence) -> Optional[Path]:
    for o in overrides:
        if o.key_or_group == "hydra.run.dir":
            return Path(o.get_value_element_as_str())
    return None


def preflight(config_dir: Path, argv: Sequence[str]) -> None:
    """Check a single run's command line before Hydra creates anything; on a refusal print one
    line and exit 2. Sweeps (`-m`) and Hydra's informational flags are left to Hydra."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        args = get_args_parser().parse_args(list(argv))
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except (SystemExit, Exception):  # noqa: BLE001 - Hydra reports bad syntax in its own words
        return
    if args.multirun or args.help or args.hydra_help or args.cfg or args.info or args.shell_completion:
        return
    job_overrides = [o.input_line for o in overrides if o.key_or_group.split(".")[0].split("/")[0] != "hydra"]
    try:
        composed = cli.compose(config_dir, "eval", job_overrides)
    except Exception:  # noqa: BLE001 - a composition error: Hydra reports it in its own words
        return
    try:
        cfg = load_eval_config(composed)
        check_run(cfg)
        run_dir = _explicit_run_dir(overrides)
        if run_dir is not None:
            refuse_checkpoint_home(run_dir, cfg.ckpt)
        if run_dir is not None and not EVAL_TASKS.get(cfg.task).resumes_in_place:
            if outputs.occupied(run_dir) and not cfg.overwrite:
                raise ConfigError(f"hydra.run.dir={str(run_dir)!r} already exists; choose another directory, or add "
                                  f"{OVERWRITE} to move it aside (to {run_dir.name}.old-<time>; nothing is deleted)")
            outputs.move_aside(run_dir)
    except (UserError, EvalError) as e:
        cli.fail(e)
