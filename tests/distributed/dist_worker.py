"""Worker of the distributed tests: run under torchrun, it trains the jobs of a JSON spec in
order, in the same processes (one launch amortises the start-up of torch and gloo).

    python -m torch.distributed.run --nproc_per_node=2 tests/distributed/dist_worker.py spec.json

spec: {"jobs": [{"cfg": <raw config dict>, "run_dir": <path>}, ...]}. A job may also name
"resume_copy_of": <run dir> and "at_step": n: rank 0 first copies that run into run_dir without
its checkpoints after step n, and the job resumes from step n there. Rank 0 also writes the
expert loads of every log step to `<run_dir>/loads.jsonl` (the logger gets them for W&B only).
A job {"materialize": <out.json>} runs tests/distributed/materialize_worker.py's checks instead
(in the same launch, so test_materialize.py pays no torchrun start of its own). A job with
"refused_to": <path> must be refused at start: every rank writes its UserError's one line to
`<path>.rank<r>.txt` (or "not refused"); put such jobs last, as train() may leave the group unusable.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch.distributed as dist  # noqa: E402

from tests.distributed.dist_helpers import copy_run_until  # noqa: E402

import moe.train.loop as loop  # noqa: E402
from moe import cli  # noqa: E402
from moe.config import load_config  # noqa: E402
from moe.errors import UserError  # noqa: E402


class LoadRecordingLogger(loop.Logger):
    def log(self, record: dict, loads=None, heatmap=None) -> None:
        super().log(record, loads=loads, heatmap=heatmap)
        if loads is not None:
            with open(self.jsonl.path.parent / "loads.jsonl", "a") as f:
                f.write(json.dumps({"step": record["step"], "loads": loads}) + "\n")


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    loop.Logger = LoadRecordingLogger
    dist.init_process_group("gloo")  # train() joins this group and leaves it open for the next job
    for job in spec["jobs"]:
        if "materialize" in job:
            from tests.distributed.materialize_worker import write_results
            write_results(Path(job["materialize"]))
            continue
        if "refused_to" in job:
            try:
                loop.train(load_config(job["cfg"]), Path(job["run_dir"]))
                said = "not refused"
            except UserError as e:
                said = cli.one_line(e)
            Path(f"{job['refused_to']}.rank{dist.get_rank()}.txt").write_text(said)
            continue
        run_dir = Path(job["run_dir"])
        if "resume_copy_of" in job:
            ckpt = [None]
            if dist.get_rank() == 0:
                ckpt[0] = str(copy_run_until(Path(job["resume_copy_of"]), run_dir, job["at_step"]))
            dist.broadcast_object_list(ckpt)
            job["cfg"]["train"]["resume"] = ckpt[0]
        loop.train(load_config(job["cfg"]), run_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
