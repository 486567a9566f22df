"""The SLURM path as far as it goes without a cluster.

`cluster.dry_run=true` makes `hydra/launcher=submitit_slurm` build the submission exactly as a launch
would (submitit's SlurmExecutor, through the plugin's parameter mapping) and write it instead of
calling sbatch. For a 2-job sweep of 2-node x 8-GPU `distributed=fsdp` jobs the script must hold
what the SLURM documentation asks of such a job (https://slurm.schedmd.com/sbatch.html,
https://slurm.schedmd.com/srun.html):

- the #SBATCH options before the first command (sbatch stops reading them there): 2 nodes, 8 tasks
  per node (one per GPU), 8 GPUs per node, CPUs per task, memory per node, the time limit in
  minutes, partition / account / QOS / constraint, a job array of the 2 jobs (`--array=0-1%2`);
- `--signal=USR2@120` (no `B:`: every task is signalled, 120 s before the time limit, which is what
  the trainer's preemption guard listens for) and `--requeue` (`scontrol requeue` of a job that is
  not requeueable fails where JobRequeue=0), `--open-mode=append` (a requeued job appends to its logs);
- the setup lines, then one `srun` that starts nodes x ntasks-per-node = 16 tasks of submitit's job
  runner with per-array-task, per-task (%t) logs.

Inside the job each task turns SLURM's variables into torch.distributed's: checked by building the
environment of task 9 of such a job.
"""

from __future__ import annotations

import json
import os
import re
import shlex

import pytest

from moe.cluster.jobs import check_job, export_torch_distributed_env, master_port
from moe.config import Config, load_config
from moe.errors import ConfigError
from tests.cluster.helpers import train_py

FSDP_2x8 = ["hydra/launcher=submitit_slurm", "router=topk,switch", "distributed=fsdp", "train.batch_size=32",
            "cluster.nodes=2", "cluster.gpus_per_node=8", "cluster.cpus_per_task=12", "cluster.mem_gb=480",
            "cluster.timeout_min=720", "cluster.partition=gpu", "cluster.account=proj42", "cluster.qos=high",
            "cluster.constraint=h100", "cluster.setup=[source .venv/bin/activate]", "logger=none"]


@pytest.fixture
def fake_srun(tmp_path):
    """submitit refuses to build a SLURM executor where `srun` is not on PATH: a stub stands in.
    Nothing is submitted (a dry run never calls sbatch, which stays absent)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text("#!/bin/sh\necho 'srun stub: nothing runs here' >&2\nexit 1\n")
    srun.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


@pytest.mark.slow
def test_slurm_submission_for_a_2_node_x_8_gpu_fsdp_sweep(tmp_path, fake_srun):
    sweep = tmp_path / "sweep"
    p = train_py(["-m", *FSDP_2x8, "cluster.dry_run=true", f"hydra.sweep.dir={sweep}"], PATH=fake_srun)
    assert p.returncode == 0, p.stderr[-3000:]
    script = (sweep / "dry_run" / "submission.sh").read_text()
    assert script in p.stdout  # printed as well
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    first_command = next(i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith("#"))
    sbatch = [ln for ln in lines if ln.startswith("#SBATCH")]
    assert all(lines.index(ln) < first_command for ln in sbatch)  # sbatch ignores #SBATCH after a command
    options = dict(ln[len("#SBATCH --"):].partition("=")[::2] for ln in sbatch)
    folder = f"{sweep}/.submitit"
    assert options == {
        "nodes": "2", "ntasks-per-node": "8", "gpus-per-node": "8", "cpus-per-task": "12", "mem": "480GB",
        "time": "720", "partition": "gpu", "account": "proj42", "qos": "high", "constraint": "h100",
        "array": "0-1%2", "signal": "USR2@120", "requeue": "", "open-mode": "append", "job-name": "train",
        "output": f"{folder}/%A_%a/%A_%a_0_log.out", "error": f"{folder}/%A_%a/%A_%a_0_log.err",
        "wckey": "submitit",
    }
    setup = lines.index("source .venv/bin/activate")
    export = lines.index("export SUBMITIT_EXECUTOR=slurm")
    srun_lines = [i for i, ln in enumerate(lines) if ln.startswith("srun ")]
    assert len(srun_lines) == 1 and first_command <= setup < export < srun_lines[0]
    srun = shlex.split(lines[srun_lines[0]])
    # one srun inside the allocation: it starts --nodes x --ntasks-per-node tasks (16), one per GPU
    assert srun[:2] == ["srun", "--unbuffered"] and not any(a.startswith(("--ntasks", "-n", "--nodes")) for a in srun)
    assert srun[srun.index("--output") + 1] == f"{folder}/%A_%a/%A_%a_%t_log.out"
    assert srun[srun.index("--error") + 1] == f"{folder}/%A_%a/%A_%a_%t_log.err"
    assert srun[-4:] == ["-u", "-m", "submitit.core._submit", f"{folder}/%j"]
    jobs = json.loads((sweep / "dry_run" / "jobs.json").read_text())
    assert [j["varying"] for j in jobs] == [{"router": "topk"}, {"router": "switch"}]
    assert all("distributed=fsdp" in j["overrides"] and "cluster.nodes=2" in j["overrides"] for j in jobs)
    assert [j["run_dir"] for j in jobs] == [str(sweep / "0"), str(sweep / "1")]
    assert not (sweep / "sweep.json").exists() and not (sweep / "0").exists()  # nothing ran


SLURM_TASK_9 = {  # what SLURM sets in task 9 (node 1, local rank 1) of array task 1 of job 4242's 2 x 8 job
    "SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4243", "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "1",
    "SLURM_NTASKS": "16", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_PROCID": "9",
    "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu-node[07-08]",
}
TORCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def test_each_task_gets_torch_distributed_env_from_slurm(monkeypatch):
    # export_torch_distributed_env writes os.environ: give it a copy, so nothing leaks into later tests
    monkeypatch.setattr(os, "environ", os.environ.copy())
    ports = []
    for rank, local, node in ((9, 1, 1), (0, 0, 0)):
        for k in TORCH_VARS:
            os.environ.pop(k, None)
        os.environ.update({**SLURM_TASK_9, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local),
                           "SLURM_NODEID": str(node)})
        exported = export_torch_distributed_env()
        assert exported == {k: os.environ[k] for k in exported} and exported["MASTER_PORT"]
        assert (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"]) == (str(rank), str(local), "16")
        assert os.environ["MASTER_ADDR"] == "gpu-node07"  # the job's first node, for every task
        assert os.environ["LOCAL_WORLD_SIZE"] == "8"
        ports.append(int(os.environ["MASTER_PORT"]))
    assert ports[0] == ports[1] == master_port("4242_1")  # every task derives the same port
    os.environ["MASTER_PORT"] = "35402"  # inherited from the submitting shell: every array job would share it
    assert export_torch_distributed_env()["MASTER_PORT"] == str(ports[0])


def test_master_port_stays_below_the_ephemeral_range(tmp_path):
    linux = tmp_path / "range"
    linux.write_text("32768\t60999\n")
    ports = {master_port(str(pid), linux) for pid in range(9000, 9400)}
    assert all(20000 <= p < 32768 for p in ports) and len(ports) > 350  # distinct jobs rarely share one
    assert master_port("9755", linux) == master_port("9755", linux)
    assert master_port("9755", linux) != 35402  # the port stop 22's CI found taken
    narrow = tmp_path / "narrow"
    narrow.write_text("20500 60999")  # no room below: submitit's range
    assert 20000 <= master_port("9755", narrow) <= 60000
    assert 20000 <= master_port("9755", tmp_path / "missing") <= 60000


def job(**sections) -> Config:
    """A 2-node x 8-GPU fsdp job's config, with `sections` replaced."""
    raw = {"cluster": dict(nodes=2, gpus_per_node=8, tasks_per_node=8), "distributed": dict(name="fsdp"),
           "train": dict(batch_size=32)}
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return load_config(raw)


def test_layouts_a_job_cannot_run_are_named_before_submission():
    check_job(job(), "slurm")  # 16 processes, 2 sequences each
    check_job(job(distributed=dict(name="ep", ep_size=8), model=dict(n_experts=16)), "slurm")
    cases = [
        (job(distributed=dict(name="none")), "slurm", "16 processes per job but distributed=none"),
        (job(train=dict(batch_size=24)), "slurm", "must be divisible by the data-parallel world size 16"),
        (job(cluster=dict(tasks_per_node=16)), "slurm", "cluster.tasks_per_node=16 > cluster.gpus_per_node=8"),
        (job(distributed=dict(name="ep", ep_size=3), model=dict(n_experts=6)), "slurm",
         "the world size 16 must be divisible by distributed.ep_size=3"),
        (job(), "local", "cluster.nodes=2: hydra/launcher=submitit_local runs every job on this machine"),
    ]
    for cfg, executor, message in cases:
        with pytest.raises(ConfigError, match=re.escape(message)):
            check_job(cfg, executor)


@pytest.mark.slow
@pytest.mark.parametrize("overrides, message", [
    (["cluster.nodes=2", "distributed=none"], "16 processes per job but distributed=none"),
    (["cluster.nodes=1,2", "distributed=fsdp"], "cluster.* must be the same for every job"),
])
def test_a_sweep_that_cannot_run_fails_before_anything_is_submitted(tmp_path, fake_srun, overrides, message):
    """One line naming the job and the field, exit status 2, and no job state or submission written."""
    sweep = tmp_path / "sweep"
    p = train_py(["-m", "hydra/launcher=submitit_slurm", "cluster.gpus_per_node=8", "logger=none",
                  "train.batch_size=32", *overrides, f"hydra.sweep.dir={sweep}"], PATH=fake_srun)
    assert p.returncode == 2
    assert re.search(r"^error: sweep job \d \(", p.stderr, re.M) and message in p.stderr, p.stderr[-2000:]
    assert not (sweep / ".sweep").exists() and not (sweep / ".submitit").exists()
