"""Train an MoE transformer: `python train.py [group=variant ...] [group.field=value ...]`.

Examples:
    python train.py                                   # tiny MoE on the Python stdlib, no download
    python train.py model.n_experts=16 router.top_k=4 optim.lr=3e-4 train.max_steps=500
    python train.py -m router.top_k=1,2 router.aux_loss_coef=0,0.01   # a Hydra sweep
    python train.py train.resume=auto                 # continue the latest run
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from moe import cli
from moe.cluster.launcher import ignore_schema_matching_warning
from moe.config import load_config
from moe.errors import UserError

log = logging.getLogger("moe")
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
ignore_schema_matching_warning()  # hydra/launcher=submitit_*: see moe/cluster/launcher.py


def discard_refused_run_dir(run_dir: Path) -> None:
    """A run refused at start leaves no directory: Hydra made this one before the job began and
    wrote only its `.hydra/` configs and the console log there (the trainer removes what it
    created itself). Anything else in it, e.g. a run it was asked to continue, keeps it."""
    if run_dir.is_dir() and all(p.name == ".hydra" or (p.suffix == ".log" and p.is_file()) for p in run_dir.iterdir()):
        shutil.rmtree(run_dir, ignore_errors=True)


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(raw: DictConfig) -> float:
    hc = HydraConfig.get()
    try:
        cfg = load_config(raw)
        if hc.mode == RunMode.MULTIRUN and cfg.logger.group is None:
            cfg.logger.group = Path(hc.sweep.dir).name  # one W&B group per sweep
        cfg.logger.tags = list(cfg.logger.tags) + [
            f"router={cfg.model.router.name}", f"experts={cfg.model.experts.name}",
            f"attention={cfg.model.attention.name}"]
        # Deliberately lazy: a config error above is reported in a second, before torch, the model
        # and the data pipeline are imported.
        from moe.train import JobInfo, train
        job = JobInfo(overrides=list(hc.overrides.task), sweep=hc.mode == RunMode.MULTIRUN)
        summary = train(cfg, Path(hc.runtime.output_dir), job)
    except UserError as e:  # a bad config value, checkpoint or variant: one line, exit 2
        discard_refused_run_dir(Path(hc.runtime.output_dir))
        cli.fail(e)
    except KeyboardInterrupt:  # Ctrl-C before the training loop, or twice in it
        discard_refused_run_dir(Path(hc.runtime.output_dir))
        print("error: interrupted; exited at once, without a checkpoint (the run's newest is in its "
              "checkpoints/ folder)", file=sys.stderr)
        sys.exit(130)
    if "stopped_nonfinite" in summary:
        n = summary["stopped_nonfinite"]
        print(f"error: the {n['what']} became {n['value']} at step {n['step']}; stopped with the checkpoint of "
              f"step {n['step'] - 1}, {n['checkpoint']} (lower optim.lr or check the data)", file=sys.stderr)
        if not job.sweep:
            sys.exit(1)
        return float("nan")  # in a sweep the other jobs go on; this one's objective is nan
    if "signal" in summary:  # SIGINT / SIGTERM: stopped after a step, with a checkpoint and summary.json
        sys.exit(summary["exit_code"])
    return summary.get("final_val_loss") or float("nan")  # the value Hydra sweepers optimise


if __name__ == "__main__":
    cli.check_hydra_overrides(CONFIG_DIR, "config")  # a misspelled key or option: one line, exit 2
    main()
