"""Train an MoE transformer: `python train.py [group=variant ...] [group.field=value ...]`.

Examples:
    python train.py                                   # tiny MoE on the Python stdlib, no download
    python train.py model.n_experts=16 router.top_k=4 optim.lr=3e-4 train.max_steps=500
    python train.py -m router.top_k=1,2 router.aux_loss_coef=0,0.01   # a Hydra sweep
    python train.py train.resume=auto                 # continue the latest run
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from moe.checkpoint import CheckpointError
from moe.config import ConfigError, load_config

log = logging.getLogger("moe")


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(raw: DictConfig) -> float:
    try:
        cfg = load_config(raw)
        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN and cfg.logger.group is None:
            cfg.logger.group = Path(hc.sweep.dir).name  # one W&B group per sweep
        cfg.logger.tags = list(cfg.logger.tags) + [
            f"router={cfg.router.name}", f"experts={cfg.experts.name}", f"attention={cfg.attention.name}"]
        from moe.train import train
        summary = train(cfg, Path(hc.runtime.output_dir))
    except (ConfigError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    return summary.get("final_val_loss") or float("nan")  # the value Hydra sweepers optimise


if __name__ == "__main__":
    main()
