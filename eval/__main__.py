"""`python -m eval task=<name> ckpt=<checkpoint> [overrides]` (see `eval/__init__.py`)."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from eval.common import EvalError, EvalLogger, IncompleteEvalError, write_json
from eval.config import load_eval_config, to_dict
from eval.generation import model_header, param_counts
from eval.preflight import check_run, claim_run_dir, discard_run_dir, preflight, refuse_checkpoint_home
from eval.tasks import EVAL_TASKS, EvalContext
from moe import cli
from moe.dtypes import dtype_name
from moe.errors import CheckpointError, UserError
from moe.loading import load_model
from moe.quant import weight_bytes
from moe.perf import device_defaults

log = logging.getLogger("moe.eval")


def run_eval(raw, run_dir: Path) -> dict:
    """Load the config, check it and what it reads (eval/preflight.py) before the run directory is
    claimed, load the checkpoint when the task needs it, run the task and write
    `<run_dir>/results.json` (what the task returns)."""
    cfg = load_eval_config(raw)
    task = EVAL_TASKS.get(cfg.task)()
    device, info = check_run(cfg)
    run_dir = Path(run_dir)
    refuse_checkpoint_home(run_dir, cfg.ckpt)
    claim_run_dir(run_dir, cfg.overwrite, task.resumes_in_place)
    run_dir.mkdir(parents=True, exist_ok=True)
    dtype = device_defaults(device, cfg.dtype, cfg.tf32, what="eval")
    torch.manual_seed(cfg.eval.seed)
    try:
        model, tokenizer, model_cfg = None, None, None
        if task.needs_model(cfg.eval) and cfg.tensor_parallel_size > 1:
            # the task's engine spawns the ranks and each reads its slices (eval.generation.open_engine):
            # this process reads only the config and tokenizer, never the whole model
            model_cfg, tokenizer = model_header(cfg.ckpt)
            info.update(**param_counts(model_cfg), tensor_parallel_size=cfg.tensor_parallel_size, expert_parallel=cfg.expert_parallel,
                        dtype=dtype_name(dtype))
        elif task.needs_model(cfg.eval):
            t0 = time.perf_counter()
            model, tokenizer, _ = load_model(cfg.ckpt, device=device, dtype=dtype, routing=cfg.router.as_dict(),
                                             quantization=cfg.quant.spec())
            model_cfg = model.cfg
            info.update(params=model.num_params(), active_params=model.num_params(active=True),
                        load_seconds=time.perf_counter() - t0, weight_bytes=weight_bytes(model),
                        dtype=dtype_name(dtype))  # what `auto` became on this device
            if cfg.quant.spec().enabled:
                info.update(quantization=cfg.quant.spec().as_dict())
        if task.needs_model(cfg.eval) and cfg.router.as_dict():
            info.update(routing=cfg.router.as_dict())
    except CheckpointError as e:
        raise CheckpointError(f"ckpt={cfg.ckpt!r}: {e}") from None
    log.info("eval %s: %s (%s) on %s -> %s", cfg.task, info["path"], info["kind"], device, run_dir)
    config = to_dict(cfg)
    logger = EvalLogger(cfg.logger, run_dir, config, cfg.task)
    try:
        try:
            results = task.run(EvalContext(cfg, config, run_dir, model, tokenizer, info, logger, device,
                                           model_cfg=model_cfg, dtype=dtype))
        except IncompleteEvalError as e:  # keep what there is, marked, then fail the command
            if e.results is not None:
                write_json(run_dir / "results.json", {**e.results, "incomplete": str(e)})
            raise
        write_json(run_dir / "results.json", results)
    finally:
        logger.close()
    log.info("results: %s", run_dir / "results.json")
    return results


CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
EXIT_INCOMPLETE = 1  # the evaluation ran but its results are incomplete (results.json says why)


@hydra.main(version_base="1.3", config_path="../configs", config_name="eval")
def main(raw: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run_eval(raw, run_dir)
    except IncompleteEvalError as e:
        print(f"error: {cli.one_line(e)}", file=sys.stderr, flush=True)
        sys.exit(EXIT_INCOMPLETE)
    except (UserError, EvalError) as e:  # a bad config, checkpoint or data path: one line, exit 2
        discard_run_dir(run_dir)  # refused: leave no empty run directory behind
        cli.fail(e)


if __name__ == "__main__":
    cli.check_hydra_overrides(CONFIG_DIR, "eval")  # a misspelled key or option: one line, exit 2
    preflight(CONFIG_DIR, sys.argv[1:])  # a refused run: one line, exit 2, no directory created
    main()
