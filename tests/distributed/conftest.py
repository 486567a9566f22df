"""One set of distributed runs shared by the parity and resume tests (one torchrun launch).

    ref        distributed=none, 10 steps: the single-process reference
    ref_accum  distributed=none, train.grad_accum=4, router aux loss off
    ddp / fsdp / ep / ep_fsdp / ep_replicas   2 processes, same config as ref
    ep_accum   2 processes, distributed=ep, same config as ref_accum (2 micro-batches per rank)
    ep_fsdp_ckpt  2 processes, ep + fsdp with train.activation_checkpointing=full, same config as ref
    from_single  2 processes (fsdp) resuming ref's single-file step-5 checkpoint
    from_two     1 process (none) resuming the ep run's 2-process DCP step-5 checkpoint
    resharded    2 processes (ep + fsdp) resuming the ep run's DCP step-5 checkpoint
    materialize  not a run: the folder of test_materialize.py's per-rank results, made by the same
                 launch after the training jobs (tests/distributed/materialize_worker.py)
    refused      not a run: each rank's one-line refusal of an impossible layout (ep_size 4 on 2
                 processes), `refused/ep4.rank<r>.txt`, the launch's last job
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed.dist_helpers import ACCUM, MODES, copy_run_until, raw_cfg, run_jobs, run_single



@pytest.fixture(scope="session")
def dist_runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("dist")
    runs = {name: tmp / name for name in ["ref", "ref_accum", *MODES, "ep_accum", "ep_fsdp_ckpt", "from_single",
                                          "from_two", "resharded"]}
    run_single(raw_cfg(tmp), runs["ref"])  # also builds the shared data cache
    run_single(raw_cfg(tmp, **ACCUM), runs["ref_accum"])
    single_ckpt = copy_run_until(runs["ref"], runs["from_single"], 5)
    jobs = [{"cfg": raw_cfg(tmp, distributed=d), "run_dir": str(runs[m])} for m, d in MODES.items()]
    jobs.append({"cfg": raw_cfg(tmp, distributed=MODES["ep"], **ACCUM), "run_dir": str(runs["ep_accum"])})
    jobs.append({"cfg": raw_cfg(tmp, distributed=MODES["ep_fsdp"], train=dict(activation_checkpointing="full")),
                 "run_dir": str(runs["ep_fsdp_ckpt"])})
    jobs.append({"cfg": raw_cfg(tmp, distributed=MODES["fsdp"], train=dict(resume=str(single_ckpt))),
                 "run_dir": str(tmp / "unused")})
    jobs.append({"cfg": raw_cfg(tmp, distributed=MODES["ep_fsdp"]), "run_dir": str(runs["resharded"]),
                 "resume_copy_of": str(runs["ep"]), "at_step": 5})
    runs["materialize"] = tmp / "materialize"
    runs["materialize"].mkdir()
    jobs.append({"materialize": str(runs["materialize"] / "out.json")})  # after the runs: they do not see it
    runs["refused"] = tmp / "refused"
    runs["refused"].mkdir()
    jobs.append({"cfg": raw_cfg(tmp, distributed=dict(name="ep", ep_size=4)), "run_dir": str(tmp / "refused_run"),
                 "refused_to": str(runs["refused"] / "ep4")})
    run_jobs(jobs, tmp)
    dcp_ckpt = copy_run_until(runs["ep"], runs["from_two"], 5)
    run_single(raw_cfg(tmp, train=dict(resume=str(dcp_ckpt))), tmp / "unused")
    return runs
