"""`python -m eval task=<name> ckpt=<checkpoint> [overrides]` (see `eval/__init__.py`)."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from moe.checkpoint import CheckpointError
from moe.config import ConfigError

log = logging.getLogger("moe.eval")

TASKS = {"truthfulqa": "eval.truthfulqa", "mt_bench": "eval.mt_bench", "sampling_sweep": "eval.sampling_sweep"}


def run_eval(raw, run_dir: Path) -> dict:
    """Load the config and the checkpoint, run the task, write `<run_dir>/results.json`."""
    import importlib

    import torch

    from eval.common import EvalLogger, resolve_device, resolve_dtype
    from eval.config import load_eval_config, to_dict
    from moe.hf_io import describe_checkpoint, load_any

    cfg = load_eval_config(raw)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype)
    torch.manual_seed(cfg.eval.seed)
    try:
        info = describe_checkpoint(cfg.ckpt) if cfg.ckpt is not None else {"kind": None, "path": None, "step": None}
        t0 = time.perf_counter()
        needs_model = not (cfg.task == "mt_bench" and cfg.eval.answer_file)
        model, tokenizer = None, None
        if needs_model:
            model, tokenizer, mcfg = load_any(cfg.ckpt, device=device, dtype=dtype)
            info.update(params=model.num_params(), active_params=model.num_params(active=True),
                        load_seconds=time.perf_counter() - t0)
    except CheckpointError as e:
        raise CheckpointError(f"ckpt={cfg.ckpt!r}: {e}") from None
    log.info("eval %s: %s (%s) on %s -> %s", cfg.task, info["path"], info["kind"], device, run_dir)
    logger = EvalLogger(cfg.logger, run_dir, to_dict(cfg), cfg.task)
    try:
        module = importlib.import_module(TASKS[cfg.task])
        results = module.run(cfg, run_dir, model, tokenizer, info, logger, device)
    finally:
        logger.close()
    log.info("results: %s", run_dir / "results.json")
    return results


@hydra.main(version_base="1.3", config_path="../configs", config_name="eval")
def main(raw: DictConfig) -> None:
    from eval.common import EvalError

    try:
        run_eval(raw, Path(HydraConfig.get().runtime.output_dir))
    except (ConfigError, CheckpointError, EvalError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
