"""The submitting side of a sweep around submitit's submission: what was submitted, sbatch's
refusals as one line, each job's end as SLURM reports it, and the sweep command's closing report.

The launcher (moe/cluster/launcher.py) calls these; the jobs themselves write their own states
(`running`, `done`, ...) into sweep.json."""

from __future__ import annotations

import contextlib
import io
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

from moe.cluster.slurm_watch import JobEnd
from moe.cluster.sweep_state import read_job, update_job, write_submission


@contextlib.contextmanager
def captured_stderr() -> Iterator[io.StringIO]:
    """submitit prints sbatch's stderr before raising; the launcher reports it itself, once, in one line."""
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer):
        yield buffer


def sbatch_refusal(error: BaseException, printed: str) -> str:
    """sbatch's own reason for refusing a submission, in one line (`Batch job submission failed: ...`)."""
    text = f"{printed}\n{error}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    reasons = [ln.split("error:", 1)[1].strip() for ln in lines if ln.startswith(("sbatch: error:", "error:"))]
    if reasons:
        return "; ".join(dict.fromkeys(reasons))  # in order, each once
    return lines[0] if lines else type(error).__name__


def record_submission(sweep_dir: Path, executor: str, jobs, nums: Sequence[int], resources: dict,
                      partition: str | None) -> None:
    """sweep.json's "submission" (executor, partition, resources, each job's SLURM job id) and each
    job's `job_id` while it is pending."""
    job_ids = {num: str(job.job_id) for job, num in zip(jobs, nums)}
    write_submission(sweep_dir, {"executor": executor, "submitted": time.time(), "partition": partition,
                                 "resources": {k: v for k, v in resources.items() if k != "dry_run"},
                                 "job_ids": {str(n): j for n, j in job_ids.items()}})
    for num, job_id in job_ids.items():
        update_job(sweep_dir, num, refresh=False, job_id=job_id)


def record_end(sweep_dir: Path, num: int, end: JobEnd, log_path: Path) -> str:
    """A job SLURM reports as ended other than COMPLETED: `failed` in sweep.json, with SLURM's state
    and reason (an error the job recorded itself is kept). Returns the error."""
    record = read_job(sweep_dir, num)
    if record.get("state") == "failed" and record.get("error"):
        return record["error"]
    error = f"SLURM: {end.state}" + (f" ({end.reason})" if end.reason else "") + f"; see {log_path}"
    update_job(sweep_dir, num, state="failed", error=error)
    return error


def report_failures(sweep_dir: Path, failed: Sequence[tuple[int, str]], total: int) -> None:
    """One line per failed job, then exit status 1 (the finished jobs' results are in place)."""
    if not failed:
        return
    for num, overrides in failed:
        error = read_job(sweep_dir, num).get("error") or "no error recorded"
        print(f"error: sweep job {num} ({overrides}) failed: {error}", file=sys.stderr)
    print(f"error: {len(failed)} of {total} sweep job(s) failed; the state of each is in {sweep_dir}/sweep.json",
          file=sys.stderr)
    sys.exit(1)
