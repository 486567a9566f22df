"""What the sweep launcher needs to know about one training job: its overrides, its checks before
submission, its torch.distributed environment inside the job, and its final metrics.

None of this submits anything (moe/cluster/launcher.py does, through submitit)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Optional, Sequence

from moe.config import Config
from moe.errors import ConfigError

WANDB_TAG_MAX = 64  # W&B refuses longer tags


def override_key(override: str) -> str:
    """`router.top_k` of `router.top_k=2`, `+x.y=1`, `~x.y` or `++x.y=1`."""
    return override.split("=", 1)[0].lstrip("+~")


def varying_overrides(job_overrides: Sequence[Sequence[str]]) -> list[dict[str, str]]:
    """Per job, {key: value} of the overrides whose value is not the same in every job of the sweep
    (`router.top_k=1,2 seed=0` -> [{"router.top_k": "1"}, {"router.top_k": "2"}])."""
    parsed = [dict((override_key(o), o.split("=", 1)[1] if "=" in o else "~") for o in job) for job in job_overrides]
    keys = sorted({k for p in parsed for k in p})
    varying = [k for k in keys if len({p.get(k) for p in parsed}) > 1]
    return [{k: p[k] for k in varying if k in p} for p in parsed]


def sweep_tags(varying: dict[str, str]) -> list[str]:
    """W&B tags naming a job's place in the sweep (`router.top_k=2`), cut to W&B's tag length."""
    return [f"{k}={v}"[:WANDB_TAG_MAX] for k, v in sorted(varying.items())]


def check_job(cfg: Config, executor: str) -> None:
    """The checks `load_config` cannot make alone: does the training layout fit the job's processes?
    Run before submission, so a sweep with a bad layout fails at once instead of in every queued job."""
    c, d = cfg.cluster, cfg.distributed
    if executor == "local" and c.nodes != 1:
        raise ConfigError(f"cluster.nodes={c.nodes}: hydra/launcher=submitit_local runs every job on this machine; "
                          "set cluster.nodes=1 (or use hydra/launcher=submitit_slurm)")
    if 0 < c.gpus_per_node < c.tasks_per_node:
        raise ConfigError(f"cluster.tasks_per_node={c.tasks_per_node} > cluster.gpus_per_node={c.gpus_per_node}: "
                          "training runs one process per GPU; set cluster.tasks_per_node <= cluster.gpus_per_node")
    if c.processes > 1 and d.name == "none":
        raise ConfigError(f"cluster.nodes={c.nodes} x cluster.tasks_per_node={c.tasks_per_node} = {c.processes} "
                          "processes per job but distributed=none (each would train its own copy); "
                          "add distributed=ddp, distributed=fsdp or distributed=ep")
    if d.name != "none":
        # Lazy: torch (via moe.distributed) is loaded when a sweep is launched, not at every Hydra start-up,
        # which imports every launcher plugin module.
        from moe.distributed.setup import check_layout
        check_layout(cfg, c.processes)


def requeue_overrides(overrides: Sequence[str], run_dir: Optional[Path]) -> list[str]:
    """The overrides of a job's next attempt (requeued by submitit after the preemption signal, or by
    SLURM itself after a `scontrol requeue` or a preemption): it always continues its own run directory.

    With a checkpoint there, `train.resume=auto` resumes it (a `train.resume=PATH` it started from is
    replaced). Before its first checkpoint, a job that started from `train.resume=PATH` branches from
    that checkpoint again (`train.overwrite=true` moves the partial attempt aside) and any other job
    gets `train.resume=auto`, which restarts it from step 0 with the partial records moved aside: the
    run-directory rule refuses a plain restart into a directory that holds a run."""
    overrides = list(overrides)
    resume = next((o.split("=", 1)[1] for o in reversed(overrides) if override_key(o) == "train.resume"), None)
    has_checkpoint = run_dir is not None and _latest_checkpoint(run_dir) is not None
    if resume not in (None, "null", "auto") and not has_checkpoint:
        return [o for o in overrides if override_key(o) != "train.overwrite"] + ["train.overwrite=true"]
    return [o for o in overrides if override_key(o) != "train.resume"] + ["train.resume=auto"]


def _latest_checkpoint(run_dir: Path):
    # Lazy: moe.checkpoint loads torch, which a launcher must not import at Hydra start-up (it is loaded
    # in the job calling this anyway).
    from moe.checkpoint import latest_checkpoint
    return latest_checkpoint(Path(run_dir))


# The kernel hands out ephemeral ports (every outgoing connection, gloo's and NCCL's many among them)
# from this range; a rendezvous port inside it can already be taken by a client socket of a job
# running beside this one (the CI failure of stop 22: two local jobs, EADDRINUSE on 35402).
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
MIN_MASTER_PORT = 20000


def master_port(job_id: str, ephemeral_range_file: Path = EPHEMERAL_RANGE_FILE) -> int:
    """The rendezvous port of job `job_id`: derived from the job id alone, so every task of the job
    computes the same one without talking to the others, and below the kernel's ephemeral range
    where the range leaves room for it (Linux default 32768-60999: ports 20000-32767)."""
    low, high = MIN_MASTER_PORT, 60000  # submitit's own range, when the ephemeral one is unknown
    try:
        ephemeral_low = int(ephemeral_range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = None
    if ephemeral_low is not None and ephemeral_low - 1 - MIN_MASTER_PORT >= 1000:
        high = ephemeral_low - 1
    return random.Random(str(job_id)).randint(low, high)


def export_torch_distributed_env() -> dict[str, str]:
    """Set MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE (torch.distributed's env://) in this
    task from submitit's view of the job: SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS and the first host of
    SLURM_JOB_NODELIST on SLURM, the local executor's equivalents on one machine; the port is
    `master_port(job id)`, so every task of the job computes the same one. A MASTER_PORT inherited
    from the submitting shell is replaced: every job of an array would inherit the same value and
    jobs sharing a node would collide. `init_distributed` (moe/distributed/setup.py) then joins the
    group exactly as under torchrun. Every task keeps every GPU of its node visible: the trainer
    picks `cuda:LOCAL_RANK`."""
    import submitit  # lazy: only inside a job (the plugin imports submitit lazily for the same reason)

    os.environ["MASTER_PORT"] = str(master_port(submitit.JobEnvironment().job_id))
    env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    return {"MASTER_ADDR": env.master_addr, "MASTER_PORT": str(env.master_port), "RANK": str(env.rank),
            "LOCAL_RANK": str(env.local_rank), "WORLD_SIZE": str(env.world_size)}


def final_metrics(run_dir: Path) -> dict:
    """A finished run's headline numbers, from the files the trainer writes (`summary.json`,
    `metrics.jsonl`): steps, initial and final validation loss, the last logged training loss."""
    run_dir = Path(run_dir)
    out: dict = {}
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        summary = {}
    for key in ("step", "initial_val_loss", "final_val_loss", "train_seconds", "stopped_early"):
        if key in summary:
            out[key] = summary[key]
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        lines = []
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "train/loss" in record:
            out["train_loss"] = record["train/loss"]
            break
    return out
