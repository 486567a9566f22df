"""The state of a sweep's jobs: `<sweep dir>/sweep.json`, merged from one file per job.

A sweep run through a submitit launcher (moe/cluster/launcher.py) records each job in
`<sweep dir>/.sweep/job_<num>.json`: its overrides, the values that vary across the sweep, its run
directory, its state and, once done, its final metrics. States:

    pending   submitted, not started        requeued  preempted or out of time: checkpointed, back in the queue
    running   started (attempt n)           done      finished; `final` holds its final metrics
    failed    the training raised, or the job died (`error` says how)

Jobs finish concurrently, and a read-modify-write of one shared file would lose entries. Here each
job file has one writer at a time (the launcher before submission and after a job died, the job's
rank 0 while it runs), every write is an atomic replace (temp file + fsync + rename), and readers
merge the job files (`read_sweep`), so no entry is lost and no lock is needed (flock is unreliable
on the network filesystems clusters share). `sweep.json` is that merge written out after every
change; a writer re-reads the job files after writing it and rewrites it while another job's change
overtook its merge, so the last writer leaves it complete.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Optional

STATES = ("pending", "running", "requeued", "done", "failed")
FINAL_STATES = ("done", "failed")
JOBS_DIR = ".sweep"
SWEEP_FILE = "sweep.json"
SUBMISSION_FILE = "submission.json"  # in JOBS_DIR: what the launcher submitted (written once, before the jobs run)


def job_file(sweep_dir: Path, num: int) -> Path:
    return Path(sweep_dir) / JOBS_DIR / f"job_{int(num)}.json"


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write `obj` as JSON so that a reader sees the old file or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_job(sweep_dir: Path, num: int) -> dict:
    """A job's record ({} when it has none yet, or it cannot be read)."""
    try:
        return json.loads(job_file(sweep_dir, num).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def update_job(sweep_dir: Path, num: int, refresh: bool = True, **fields) -> dict:
    """Merge `fields` into job `num`'s record, write it, refresh `sweep.json` (unless the caller
    writes many records and refreshes once); returns the record."""
    state = fields.get("state")
    if state is not None and state not in STATES:
        raise ValueError(f"job state {state!r} is not one of {STATES}")
    record = {**read_job(sweep_dir, num), "num": int(num), **fields, "updated": time.time()}
    write_json_atomic(job_file(sweep_dir, num), record)
    if refresh:
        refresh_sweep_json(sweep_dir)
    return record


def read_jobs(sweep_dir: Path) -> list[dict]:
    """Every job's record, by job number."""
    d = Path(sweep_dir) / JOBS_DIR
    records = []
    for p in d.glob("job_*.json") if d.is_dir() else []:
        try:
            records.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError):  # replaced atomically, so only an unreadable file lands here
            continue
    return sorted(records, key=lambda r: r.get("num", -1))


def write_submission(sweep_dir: Path, record: dict) -> None:
    """What was submitted (executor, job ids, resources): `sweep.json`'s "submission"."""
    write_json_atomic(Path(sweep_dir) / JOBS_DIR / SUBMISSION_FILE, record)


def read_submission(sweep_dir: Path) -> Optional[dict]:
    try:
        return json.loads((Path(sweep_dir) / JOBS_DIR / SUBMISSION_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def merge(sweep_dir: Path, jobs: list[dict]) -> dict:
    counts = {s: sum(j.get("state") == s for j in jobs) for s in STATES}
    merged = {"sweep_dir": str(sweep_dir), "counts": counts, "jobs": jobs}
    submission = read_submission(sweep_dir)
    if submission is not None:
        merged["submission"] = submission
    return merged


def read_sweep(sweep_dir: Path) -> Optional[dict]:
    """The sweep's state merged from its job files (or its `sweep.json` when the job files are
    gone); None for a directory that no launcher wrote (a plain `python train.py -m` sweep)."""
    jobs = read_jobs(sweep_dir)
    if jobs:
        return merge(sweep_dir, jobs)
    try:
        return json.loads((Path(sweep_dir) / SWEEP_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def refresh_sweep_json(sweep_dir: Path, max_rounds: int = 50) -> dict:
    """Write `sweep.json` from the job files until a re-read after the write finds nothing newer."""
    jobs = read_jobs(sweep_dir)
    for _ in range(max_rounds):
        write_json_atomic(Path(sweep_dir) / SWEEP_FILE, merge(sweep_dir, jobs))
        again = read_jobs(sweep_dir)
        if again == jobs:
            break
        jobs = again
    return merge(sweep_dir, jobs)
