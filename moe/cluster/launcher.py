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
import os
import signal
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

from moe import cli
from moe.cluster.jobs import (check_job, export_torch_distributed_env, final_metrics, requeue_overrides, sweep_tags,
                              varying_overrides)
from moe.cluster.slurm_limits import check_resources
from moe.cluster.slurm_watch import JobEnd, SlurmWatcher
from moe.cluster.submission import (captured_stderr, record_end, record_submission, report_failures,
                                    sbatch_refusal)
from moe.cluster.sweep_state import read_job, refresh_sweep_json, update_job
from moe.config import Config, load_config
from moe.errors import ConfigError

log = logging.getLogger(__name__)


def ignore_schema_matching_warning() -> None:
    """Our presets keep the plugin's names (`hydra/launcher=submitit_slurm`), so Hydra 1.3 checks each
    against the plugin's ConfigStore schema of the same name and warns that this matching is
    deprecated. The presets are valid against that schema on purpose; the warning tells a user nothing."""
    warnings.filterwarnings("ignore", message=r"[\s\S]*'hydra/launcher/submitit_\w+' is validated against")


def cluster_int(name: str, value: Any) -> Optional[int]:
    """`${moe_int:cluster.timeout_min,${cluster.timeout_min}}` in the launcher presets: the value as an
    int. Hydra resolves the presets when it creates the launcher, before any of our checks run, and
    a value the plugin's schema cannot convert was a 60-line OmegaConf traceback: here it is one
    line and exit status 2 (raising would be wrapped into that traceback again)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    try:
        return int(str(value))
    except ValueError:
        cli.fail(f"{name}={value!r}: expected a whole number")


OmegaConf.register_new_resolver("moe_int", cluster_int, replace=True)


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
        partition = None
        try:
            checked = {num: self._check(num, overrides, resources) for num, overrides in zip(nums, job_overrides)}
            if self._EXECUTOR == "slurm" and not resources["dry_run"]:
                # Asked of the cluster itself: a request no node or partition can satisfy would pend forever.
                partition = check_resources(checked[nums[0]][1].cluster)
        except ConfigError as e:  # as train.py reports its own: one line, exit status 2, nothing submitted
            _discard_unused(sweep_dir)
            cli.fail(e)
        run_dirs = {num: run_dir for num, (run_dir, _) in checked.items()}
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
        try:
            with captured_stderr() as printed:
                jobs = executor.map_array(self, *zip(*job_params))
        except Exception as e:  # sbatch refused the submission (a limit, an account, a partition...)
            reason = sbatch_refusal(e, printed.getvalue())
            for num in nums:
                update_job(sweep_dir, num, refresh=False, state="failed", error=f"not submitted: {reason}")
            refresh_sweep_json(sweep_dir)
            cli.fail(f"sbatch refused the sweep: {reason}")
        record_submission(sweep_dir, self._EXECUTOR, jobs, nums, resources, partition)
        refresh_sweep_json(sweep_dir)
        returns = self._wait(jobs, nums, job_overrides, sweep_dir)
        failed = [(num, " ".join(filter_overrides(o))) for num, o, r in zip(nums, job_overrides, returns)
                  if r.status != JobStatus.COMPLETED]
        report_failures(sweep_dir, failed, len(nums))
        return returns

    def _wait(self, jobs, nums: list[int], job_overrides, sweep_dir: Path) -> list[JobReturn]:
        """Each job's JobReturn once it has ended. On SLURM a job has ended when SLURM says so
        (moe/cluster/slurm_watch.py: requeues, cancelled arrays, jobs that can never start)."""
        ends: dict[str, JobEnd] = {}
        if self._EXECUTOR == "slurm":
            by_id = {str(job.job_id): (num, job) for job, num in zip(jobs, nums)}

            def on_end(job_id: str, end: JobEnd) -> None:
                if end.state != "COMPLETED":
                    num, job = by_id[job_id]
                    log.warning("sweep job %d (SLURM job %s) ended %s: %s", num, job_id, end.state,
                                record_end(sweep_dir, num, end, job.paths.stdout))

            ends = SlurmWatcher(list(by_id), on_end).wait()
        returns = []
        for job, num, overrides in zip(jobs, nums, job_overrides):
            end = ends.get(str(job.job_id))
            if end is None or end.state == "COMPLETED":
                returns.append(self._result(job, num, overrides, sweep_dir))
            else:
                ret = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
                ret.return_value = RuntimeError(read_job(sweep_dir, num).get("error"))
                returns.append(ret)
        return returns

    def _check(self, num: int, overrides: Sequence[str], resources: dict) -> tuple[Path, Config]:
        """Compose and validate job `num`; returns its run directory and config. ConfigError names the job."""
        cfg = self._job_config(overrides, num)
        try:
            job = load_config(cfg)
            if OmegaConf.to_container(cfg.cluster, resolve=True) != resources:
                raise ConfigError("cluster.* must be the same for every job of a sweep (one submission sets the "
                                  "resources of all): run one sweep per cluster setting")
            check_job(job, self._EXECUTOR)
        except ConfigError as e:
            raise ConfigError(f"sweep job {num} ({' '.join(filter_overrides(overrides))}): {e}") from None
        return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir), job

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
        sweep_dir = Path(str(cfg.hydra.sweep.dir))
        run_dir = sweep_dir / str(cfg.hydra.sweep.subdir)
        restarts = _slurm_restarts()
        if restarts:  # requeued by SLURM itself (scontrol requeue, a preemption) with the submitted overrides
            cfg = self._job_config(requeue_overrides(sweep_overrides, run_dir), job_num)
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.id = env.job_id
        cfg.logger.tags = list(cfg.logger.tags) + [t for t in self.job_tags.get(job_num, []) if t not in cfg.logger.tags]
        main = env.global_rank == 0  # rank 0 alone writes the job's state, as it alone writes its run directory
        if main:
            attempts = read_job(sweep_dir, job_num).get("attempts", 0) + 1
            # Every attempt after the first is a requeue, whoever requeued it (submitit, SLURM, an admin).
            update_job(sweep_dir, job_num, state="running", attempts=attempts, requeues=attempts - 1,
                       slurm_restarts=restarts, error=None, job_id=env.job_id, processes=env.num_tasks,
                       log=str(env.paths.stdout), run_dir=str(run_dir))
        try:
            ret = run_job(hydra_context=self.hydra_context, task_function=self.task_function, config=cfg,
                          job_dir_key=job_dir_key, job_subdir_key="hydra.sweep.subdir")
        except BaseException as e:  # train.py's error exit, or submitit's exit after requeueing the job
            if main and read_job(sweep_dir, job_num).get("state") != "requeued":
                if self._EXECUTOR == "slurm" and _stopped_by_sigterm(e):
                    update_job(sweep_dir, job_num, state="requeued", error=None,
                               note=f"stopped by SIGTERM with a checkpoint (attempt {attempts}): SLURM requeues a "
                                    "preempted job; a cancelled one is marked failed by the sweep command")
                else:
                    update_job(sweep_dir, job_num, state="failed", error=_describe(e, env.paths.stderr))
            raise
        if main:
            if ret.status == JobStatus.COMPLETED:
                update_job(sweep_dir, job_num, state="done", final=final_metrics(run_dir), error=None, note=None)
            else:
                update_job(sweep_dir, job_num, state="failed", error=_describe(ret._return_value, env.paths.stderr))
        return ret

    def checkpoint(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str,
                   singleton_state: dict) -> Any:
        """submitit calls this in the job's rank 0 when the cluster signals a preemption or the time
        limit: after the trainer saved a checkpoint at a step boundary (moe/train/preemption.py), or at
        once when the signal comes before the training loop (start-up, the first validation). The job
        is resubmitted to continue its own run directory (`requeue_overrides`: `train.resume=auto`)."""
        import submitit  # lazy: see _executor

        overrides = requeue_overrides(sweep_overrides, _current_run_dir())
        sweep_dir = _current_sweep_dir() or Path(str(self.config.hydra.sweep.dir))
        update_job(sweep_dir, job_num, state="requeued", requeues=read_job(sweep_dir, job_num).get("attempts", 1))
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


def _discard_unused(sweep_dir: Path) -> None:
    """A sweep refused before submission leaves no directory: Hydra wrote only its multirun.yaml there."""
    if sweep_dir.is_dir() and [p.name for p in sweep_dir.iterdir()] == ["multirun.yaml"]:
        (sweep_dir / "multirun.yaml").unlink()
        sweep_dir.rmdir()


def _slurm_restarts() -> int:
    """How often SLURM restarted this job (SLURM_RESTART_COUNT; 0 outside SLURM)."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def _stopped_by_sigterm(error: BaseException) -> bool:
    """train.py's exit after a SIGTERM stop (128 + 15), with its checkpoint written."""
    return isinstance(error, SystemExit) and error.code == 128 + signal.SIGTERM


def _describe(error: Any, log_path: Path) -> str:
    if isinstance(error, SystemExit):
        return f"exited with status {error.code}; see {log_path}"
    return f"{type(error).__name__}: {str(error).strip()[:2000]}; see {log_path}"
