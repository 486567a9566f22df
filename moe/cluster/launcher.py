"""Sweeps on a cluster: Hydra's submitit launcher (`hydra-submitit-launcher`) for training jobs.

    python train.py -m hydra/launcher=submitit_slurm cluster.partition=gpu cluster.nodes=2 \\
        cluster.gpus_per_node=8 distributed=fsdp router=topk,switch      # docs/guides/cluster.md

Submission, job arrays, the local executor, the preemption signal and requeueing are submitit's;
the launcher is the plugin's (`BaseSubmititLauncher`), with what training jobs need on top:

- before anything is submitted, every job's config is composed, validated like `train.py` does, and
  its layout checked against the job's processes (moe/cluster/jobs.py): a typo fails in seconds on
  the login node, not in every queued job;
- inside a job each process gets torch.distributed's environment from submitit's view of the job
  (RANK from SLURM_PROCID, ...), so `distributed=ddp|fsdp|ep` runs unchanged;
- `<sweep dir>/sweep.json` tracks each job (moe/cluster/sweep_state.py) and each job's W&B run is
  tagged with the values that vary across the sweep (its group is the sweep, as in any sweep);
- on a preemption or time limit the trainer checkpoints at a step boundary (moe/train/preemption.py)
  and hands the signal to submitit, which calls `checkpoint` below: the job is requeued with
  `train.resume=auto` and continues from its own checkpoint;
- `cluster.dry_run=true` writes the submission script and each job's overrides, and submits nothing.

Hydra instantiates launchers only from the `hydra_plugins` namespace: the classes named by
configs/hydra/launcher/*.yaml are the two-line subclasses in hydra_plugins/moe_lab.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides, run_job, setup_globals
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from omegaconf import DictConfig, OmegaConf, open_dict

from moe.cluster.jobs import (check_job, export_torch_distributed_env, final_metrics, override_key, sweep_tags,
                              varying_overrides)
from moe.cluster.sweep_state import read_job, refresh_sweep_json, update_job
from moe.config import load_config
from moe.errors import ConfigError

log = logging.getLogger(__name__)


def ignore_schema_matching_warning() -> None:
    """Our presets keep the plugin's names (`hydra/launcher=submitit_slurm`), so Hydra 1.3 checks each
    against the plugin's ConfigStore schema of the same name and warns that this matching is
    deprecated. The presets are valid against that schema on purpose; the warning tells a user nothing."""
    warnings.filterwarnings("ignore", message=r"[\s\S]*'hydra/launcher/submitit_\w+' is validated against")


@contextmanager
def quiet_schema_matching():
    with warnings.catch_warnings():
        ignore_schema_matching_warning()
        yield


class SubmititSweepLauncher(BaseSubmititLauncher):
    """The plugin's launcher for training sweeps (see the module docstring); `_EXECUTOR` is set by
    the subclasses in hydra_plugins/moe_lab."""

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.job_tags: dict[int, list[str]] = {}  # per job number, set in `launch`, pickled with the launcher

    # ------------------------------------------------------------------ in the submitting process
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        nums = list(range(initial_job_idx, initial_job_idx + len(job_overrides)))
        # The launcher's resources come from the sweep's own config (hydra.launcher.* interpolates cluster.*).
        resources = OmegaConf.to_container(self.config.cluster, resolve=True)
        varying = varying_overrides([filter_overrides(o) for o in job_overrides])
        try:
            run_dirs = {num: self._check(num, overrides, resources) for num, overrides in zip(nums, job_overrides)}
        except ConfigError as e:  # as train.py reports its own: one line, exit status 2, nothing submitted
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        self.job_tags = {num: sweep_tags(v) for num, v in zip(nums, varying)}
        executor = self._executor()
        if resources["dry_run"]:
            return self._dry_run(executor, sweep_dir, nums, job_overrides, varying, run_dirs)

        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:  # as the plugin's launch does
            sweep_dir.chmod(int(str(self.config.hydra.sweep.mode), 8))
        for num, overrides, vary in zip(nums, job_overrides, varying):
            update_job(sweep_dir, num, refresh=False, state="pending", overrides=list(filter_overrides(overrides)),
                       varying=vary, run_dir=str(run_dirs[num]), attempts=0, requeues=0, final=None, error=None)
        refresh_sweep_json(sweep_dir)
        log.info("Submitit '%s' sweep output dir: %s", self._EXECUTOR, sweep_dir)
        for num, overrides in zip(nums, job_overrides):
            log.info("\t#%d : %s", num, " ".join(filter_overrides(overrides)))
        job_params = [(list(o), "hydra.sweep.dir", num, f"job_id_for_{num}", Singleton.get_state())
                      for num, o in zip(nums, job_overrides)]
        jobs = executor.map_array(self, *zip(*job_params))
        return [self._result(job, num, overrides, sweep_dir) for job, num, overrides in zip(jobs, nums, job_overrides)]

    def _check(self, num: int, overrides: Sequence[str], resources: dict) -> Path:
        """Compose and validate job `num`; returns its run directory. ConfigError names the job."""
        cfg = self._job_config(overrides, num)
        try:
            job = load_config(cfg)
            if OmegaConf.to_container(cfg.cluster, resolve=True) != resources:
                raise ConfigError("cluster.* must be the same for every job of a sweep (one submission sets the "
                                  "resources of all): run one sweep per cluster setting")
            check_job(job, self._EXECUTOR)
        except ConfigError as e:
            raise ConfigError(f"sweep job {num} ({' '.join(filter_overrides(overrides))}): {e}") from None
        return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)

    def _job_config(self, overrides: Sequence[str], num: int) -> DictConfig:
        with quiet_schema_matching():
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.num = num
        return cfg

    def _executor(self):
        """submitit's executor with this launcher's parameters, mapped exactly as the plugin's `launch` does."""
        import submitit  # lazy: Hydra imports every launcher module at start-up (the plugin defers it too)

        params = dict(self.params)
        init = {"folder": params.pop("submitit_folder")}
        if "max_num_timeout" in params:
            init[f"{self._EXECUTOR}_max_num_timeout"] = params.pop("max_num_timeout")
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, **init)
        generic = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in generic else f"{self._EXECUTOR}_{k}": v for k, v in params.items()})
        return executor

    def _result(self, job, num: int, overrides: Sequence[str], sweep_dir: Path) -> JobReturn:
        """The job's JobReturn; a job that died without one (killed, out of memory, node failure) is
        recorded as failed in sweep.json and returned as a failure, after the other jobs are waited for."""
        try:
            return job.results()[0]
        except Exception as e:  # submitit's UncompletedJobError / FailedJobError: the job left no result
            if read_job(sweep_dir, num).get("state") not in ("done", "failed"):
                update_job(sweep_dir, num, state="failed", error=f"{type(e).__name__}: {str(e).strip()[:2000]}")
            ret = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
            ret.return_value = e
            return ret

    def _dry_run(self, executor, sweep_dir: Path, nums, job_overrides, varying, run_dirs) -> list[JobReturn]:
        """Write what a launch would submit to `<sweep dir>/dry_run/` and print it; submit nothing."""
        out = sweep_dir / "dry_run"
        out.mkdir(parents=True, exist_ok=True)
        jobs = [{"num": n, "overrides": list(filter_overrides(o)), "varying": v, "run_dir": str(run_dirs[n])}
                for n, o, v in zip(nums, job_overrides, varying)]
        (out / "jobs.json").write_text(json.dumps(jobs, indent=2))
        script = submission_script(executor, len(jobs))
        if script:
            (out / "submission.sh").write_text(script)
            print(script)
        print(f"dry run: {len(jobs)} job(s), nothing submitted; wrote {out}/" + ("submission.sh and " if script else "")
              + "jobs.json")
        return [JobReturn(overrides=list(o), status=JobStatus.COMPLETED, _return_value=None) for o in job_overrides]

    # ------------------------------------------------------------------ inside each task of a job
    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: dict) -> JobReturn:
        import submitit  # lazy: see _executor

        env = submitit.JobEnvironment()
        if env.num_tasks > 1:
            export_torch_distributed_env()
        Singleton.set_state(singleton_state)
        setup_globals()
        cfg = self._job_config(sweep_overrides, job_num)
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.id = env.job_id
        cfg.logger.tags = list(cfg.logger.tags) + [t for t in self.job_tags.get(job_num, []) if t not in cfg.logger.tags]
        sweep_dir = Path(str(cfg.hydra.sweep.dir))
        run_dir = sweep_dir / str(cfg.hydra.sweep.subdir)
        main = env.global_rank == 0  # rank 0 alone writes the job's state, as it alone writes its run directory
        if main:
            before = read_job(sweep_dir, job_num)
            update_job(sweep_dir, job_num, state="running", attempts=before.get("attempts", 0) + 1, job_id=env.job_id,
                       processes=env.num_tasks, log=str(env.paths.stdout), run_dir=str(run_dir))
        try:
            ret = run_job(hydra_context=self.hydra_context, task_function=self.task_function, config=cfg,
                          job_dir_key=job_dir_key, job_subdir_key="hydra.sweep.subdir")
        except BaseException as e:  # train.py's error exit, or submitit's exit after requeueing the job
            if main and read_job(sweep_dir, job_num).get("state") != "requeued":
                update_job(sweep_dir, job_num, state="failed", error=_describe(e, env.paths.stderr))
            raise
        if main:
            if ret.status == JobStatus.COMPLETED:
                update_job(sweep_dir, job_num, state="done", final=final_metrics(run_dir), error=None)
            else:
                update_job(sweep_dir, job_num, state="failed", error=_describe(ret._return_value, env.paths.stderr))
        return ret

    def checkpoint(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str,
                   singleton_state: dict) -> Any:
        """submitit calls this in the job's rank 0 when the cluster signals a preemption or the time
        limit, after the trainer saved a checkpoint at a step boundary (moe/train/preemption.py). The
        job is resubmitted with `train.resume=auto` once its run directory holds a checkpoint (a
        `train.resume=PATH` it started from is replaced: the requeued job continues its own run);
        before its first checkpoint it restarts as submitted."""
        import submitit  # lazy: see _executor

        overrides = list(sweep_overrides)
        run_dir = _current_run_dir()
        if run_dir is not None and _has_checkpoint(run_dir):
            overrides = [o for o in overrides if override_key(o) != "train.resume"] + ["train.resume=auto"]
        sweep_dir = _current_sweep_dir() or Path(str(self.config.hydra.sweep.dir))
        update_job(sweep_dir, job_num, state="requeued", requeues=read_job(sweep_dir, job_num).get("requeues", 0) + 1)
        return submitit.helpers.DelayedSubmission(self, overrides, job_dir_key, job_num, job_id, singleton_state)


def submission_script(executor, n_jobs: int) -> str:
    """The sbatch script submitit would submit for `n_jobs` jobs (one job array when n_jobs > 1), built
    as submitit's SlurmExecutor builds it; "" for executors without one (local)."""
    ex = executor._executor  # the cluster's executor inside submitit's AutoExecutor
    if ex.name() != "slurm":
        return ""
    array_ex = type(ex)(ex.folder, ex.max_num_timeout)
    array_ex.update_parameters(**ex.parameters)
    if n_jobs > 1:
        array_ex.parameters["map_count"] = n_jobs  # what SlurmExecutor does for a job array
    return array_ex._make_submission_file_text(ex._submitit_command_str, "dry_run")


def _current_run_dir() -> Optional[Path]:
    try:
        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # the signal came before Hydra set up the job
        return None


def _current_sweep_dir() -> Optional[Path]:
    try:
        return Path(str(HydraConfig.get().sweep.dir))
    except ValueError:
        return None


def _has_checkpoint(run_dir: Path) -> bool:
    # Lazy: moe.checkpoint loads torch, which a launcher must not import at Hydra start-up (it is loaded
    # in the job calling this anyway).
    from moe.checkpoint import latest_checkpoint
    return latest_checkpoint(run_dir) is not None


def _describe(error: Any, log_path: Path) -> str:
    if isinstance(error, SystemExit):
        return f"exited with status {error.code}; see {log_path}"
    return f"{type(error).__name__}: {str(error).strip()[:2000]}; see {log_path}"
