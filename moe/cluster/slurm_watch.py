"""Waiting for a submitted sweep on SLURM until every job has ended, whatever ended it.

submitit's own wait (`job.results()`) returns once a job's result file exists and otherwise polls
`sacct`, which fails a sweep in three ways on a real cluster: a job SLURM requeues itself
(`scontrol requeue`, PreemptMode=REQUEUE) leaves its first attempt's error result behind, so the
job counts as failed while it runs again; a job array pending as one line (`11_[0-1%2] CANCELLED`
after an `scancel`) is not matched to its jobs, so the command waits forever; and a job pending
for a reason that never clears (`PartitionConfig`) is waited for forever. Here a job has ended when
SLURM says so (its state, not a file), array ranges are expanded, and a job pending for such a
reason is cancelled with that reason.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from moe.cluster.slurm_limits import Run, run_command

log = logging.getLogger(__name__)

# States of a job that has not ended (a requeued job passes through REQUEUED and PENDING again).
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "COMPLETING", "CONFIGURING",
          "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "PREEMPTED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
# Pending reasons no waiting clears: the request exceeds what the partition, QOS or association allows.
NEVER_CLEARS = {
    "PartitionConfig": "the partition can never run it (its nodes lack the CPUs, GPUs or memory asked for)",
    "PartitionTimeLimit": "its time limit exceeds the partition's MaxTime",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "BadConstraints": "no node has the features asked for",
    "InvalidAccount": "the account does not exist or is not yours",
    "InvalidQOS": "the QOS does not exist or is not allowed",
    "QOSMaxWallDurationPerJobLimit": "its time limit exceeds the QOS's",
    "AssocMaxWallDurationPerJobLimit": "its time limit exceeds the association's",
    "QOSMaxNodePerJobLimit": "it asks for more nodes than the QOS allows",
    "QOSMaxCpuPerJobLimit": "it asks for more CPUs than the QOS allows",
    "QOSMaxGRESPerJob": "it asks for more GPUs than the QOS allows",
    "DependencyNeverSatisfied": "a dependency can never be satisfied",
}


@dataclass
class JobEnd:
    state: str  # SLURM's final state (COMPLETED, FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, ...)
    reason: str = ""  # why, when SLURM or this watcher knows (the pending reason of a cancelled job)


def expand_job_id(job_id: str) -> list[str]:
    """`12` -> [12]; `12_3` -> [12_3]; `12_[0-2,5%2]` -> [12_0, 12_1, 12_2, 12_5]."""
    m = re.fullmatch(r"(\d+)_\[([^\]]*)\]", job_id)
    if not m:
        return [job_id]
    base, spec = m.group(1), m.group(2).split("%")[0]
    ids = []
    for part in filter(None, spec.split(",")):
        low, _, high = part.partition("-")
        ids.extend(f"{base}_{i}" for i in range(int(low), int(high or low) + 1))
    return ids


def parse_states(out: str) -> dict[str, tuple[str, str]]:
    """`JobID|State|Reason` lines (sacct -P, squeue -o) -> {job id: (state, reason)}; a range line
    names every job in it, and a job's own line wins over a range's."""
    states: dict[str, tuple[str, str]] = {}
    for line in sorted(out.splitlines(), key=lambda x: "[" not in x, reverse=False):
        fields = line.strip().split("|")
        if len(fields) < 2 or not fields[0] or "." in fields[0]:
            continue  # job steps (12.batch, 12.0) end with their job
        state = fields[1].split()[0].upper() if fields[1].strip() else ""
        reason = fields[2].strip() if len(fields) > 2 else ""
        for jid in expand_job_id(fields[0]):
            states[jid] = (state, reason)
    return states


def query(array_ids: Iterable[str], run: Run = run_command) -> dict[str, tuple[str, str]]:
    """Every job's (state, reason): sacct (accounting, also for ended jobs), then squeue (live
    state and pending reason) over it."""
    ids = sorted(set(array_ids))
    states = parse_states(run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,Reason", "-j", ",".join(ids)]) or "")
    states.update(parse_states(run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%T|%r"]) or ""))
    return states


def never_clears(reason: str, run: Run = run_command) -> Optional[str]:
    """Why a pending job with `reason` will never start (None: it may start later)."""
    key = reason.split(",")[0].strip()
    if key in NEVER_CLEARS:
        return f"{key}: {NEVER_CLEARS[key]}"
    if key == "ReqNodeNotAvail":  # unavailable nodes that exist may come back; ones that do not never will
        listed = reason.partition("UnavailableNodes:")[2].strip()
        if listed and run(["scontrol", "show", "node", listed]) is None:
            return f"ReqNodeNotAvail: the requested node(s) {listed} do not exist on this cluster"
    return None


class SlurmWatcher:
    """Polls SLURM for `job_ids` until each has ended; `on_end(job_id, JobEnd)` is called once per job."""

    def __init__(self, job_ids: list[str], on_end: Callable[[str, JobEnd], None], run: Run = run_command,
                 poll_s: float = 2.0, max_poll_s: float = 30.0, sleep: Callable[[float], None] = time.sleep):
        self.pending_ids, self.on_end, self.run = list(job_ids), on_end, run
        self.poll_s, self.max_poll_s, self.sleep = poll_s, max_poll_s, sleep
        self.ended: dict[str, JobEnd] = {}
        self.hopeless: dict[str, str] = {}  # job id -> why it can never start, seen once (cancelled when seen twice)

    def step(self) -> None:
        states = query({j.split("_")[0] for j in self.pending_ids}, self.run)
        for jid in list(self.pending_ids):
            state, reason = states.get(jid, ("", ""))
            if state and state not in ACTIVE:
                self._end(jid, JobEnd(state, reason if reason not in ("None", "") else ""))
            elif state == "PENDING" and (why := never_clears(reason, self.run)):
                if self.hopeless.get(jid) == why:  # twice in a row: not a passing state of the scheduler
                    self.run(["scancel", jid])
                    log.error("SLURM job %s can never start (%s): cancelled", jid, why)
                    self._end(jid, JobEnd("CANCELLED", f"never started: {why}"))
                self.hopeless[jid] = why
            else:
                self.hopeless.pop(jid, None)

    def _end(self, jid: str, end: JobEnd) -> None:
        self.ended[jid] = end
        self.pending_ids.remove(jid)
        self.on_end(jid, end)

    def wait(self) -> dict[str, JobEnd]:
        delay = self.poll_s
        while self.pending_ids:
            self.step()
            if self.pending_ids:
                self.sleep(delay)
                delay = min(self.max_poll_s, delay * 1.5)
        return self.ended
