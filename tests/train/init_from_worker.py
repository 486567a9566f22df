"""Worker of tests/train/test_init_from_distributed.py: under torchrun, it trains the jobs of a
JSON spec in order, each as `python train.py <args>` would (the args composed by Hydra and passed
on as the job's overrides).

    python -m torch.distributed.run --nproc_per_node=2 tests/train/init_from_worker.py spec.json

spec: {"jobs": [{"args": [...], "run_dir": <path>}, ...]}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch.distributed as dist  # noqa: E402

from moe.train import JobInfo, train  # noqa: E402
from tests.train.finetune_helpers import composed  # noqa: E402


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    dist.init_process_group("gloo")  # train() joins this group and leaves it open for the next job
    for job in spec["jobs"]:
        train(composed(job["args"]), Path(job["run_dir"]), JobInfo(overrides=job["args"]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
