"""The SLURM-facing pieces of the launcher without a cluster: sacct/squeue lines (array ranges), pending
reasons that never clear, the resource checks against `scontrol`/`sinfo`/`sacctmgr` output, and the
overrides of a requeued job."""

from __future__ import annotations

from pathlib import Path

import pytest

from moe.cluster.jobs import requeue_overrides
from moe.cluster.slurm_limits import check_resources, gpu_count, minutes
from moe.cluster.slurm_watch import JobEnd, SlurmWatcher, expand_job_id, never_clears, parse_states
from moe.config import ClusterConfig
from moe.errors import ConfigError


def test_array_ranges_name_every_job():
    assert expand_job_id("11_[0-1%2]") == ["11_0", "11_1"]
    assert expand_job_id("7_[0,3-4]") == ["7_0", "7_3", "7_4"]
    assert expand_job_id("12") == ["12"] and expand_job_id("12_3") == ["12_3"]
    states = parse_states("11_[0-1%2]|CANCELLED by 0|None\n11_1|RUNNING|None\n11_1.batch|RUNNING|\n")
    assert states == {"11_0": ("CANCELLED", "None"), "11_1": ("RUNNING", "None")}


def test_pending_reasons_that_never_clear():
    assert never_clears("PartitionConfig").startswith("PartitionConfig: ")
    assert never_clears("Resources") is None and never_clears("BeginTime") is None
    gone = lambda cmd: None  # noqa: E731 - scontrol knows no such node
    assert "gpu-99 do not exist" in never_clears("ReqNodeNotAvail, UnavailableNodes:gpu-99", gone)
    assert never_clears("ReqNodeNotAvail, UnavailableNodes:gpu-1", lambda cmd: "NodeName=gpu-1") is None


def test_the_watcher_cancels_a_hopeless_job_and_ends_a_cancelled_array():
    calls, ended = [], {}
    answers = {"sacct": "20_[0-1]|PENDING|PartitionConfig\n", "squeue": ""}

    def run(cmd):
        calls.append(cmd)
        return answers.get(cmd[0], "")

    watcher = SlurmWatcher(["20_0", "20_1"], lambda j, e: ended.setdefault(j, e), run=run, sleep=lambda s: None)
    watcher.wait()
    assert ended == {j: JobEnd("CANCELLED", "never started: PartitionConfig: the partition can never run it "
                                             "(its nodes lack the CPUs, GPUs or memory asked for)")
                     for j in ("20_0", "20_1")}
    assert ["scancel", "20_0"] in calls and ["scancel", "20_1"] in calls


PARTITION = ("PartitionName=gpu Default=YES MaxNodes=UNLIMITED MaxTime=2-00:00:00 State=UP TotalNodes=4 "
             "MaxMemPerNode=UNLIMITED\n")
SINFO = "g1|64|512000|gpu:a100:8(S:0-1)|a100\ng2|64|512000|gpu:a100:8(S:0-1)|a100\n"


def fake_cluster(cmd):
    return {"scontrol": PARTITION, "sinfo": SINFO, "sacctmgr": "proj|normal,high\n"}[cmd[0]]


@pytest.mark.parametrize("fields, message", [
    (dict(gpus_per_node=16), "cluster.gpus_per_node=16: the nodes of partition gpu have at most 8 GPUs"),
    (dict(timeout_min=3000), "cluster.timeout_min=3000: partition gpu allows at most 2880 minutes"),
    (dict(nodes=3), "cluster.nodes=3: partition gpu has 2 node(s) with the GPUs, CPUs and memory"),
    (dict(constraint="h100"), "cluster.constraint=h100: no node of partition gpu has that feature (features: a100)"),
    (dict(account="other"), "cluster.account=other: you ("),
    (dict(qos="urgent"), "cluster.qos=urgent: not allowed for your association on this cluster (allowed: high, normal)"),
])
def test_resources_are_checked_against_what_the_cluster_reports(fields, message):
    with pytest.raises(ConfigError) as e:
        check_resources(ClusterConfig(**{"gpus_per_node": 8, "tasks_per_node": 8, **fields}), run=fake_cluster)
    assert str(e.value).startswith(message), str(e.value)


def test_a_request_that_fits_passes_and_an_unreachable_cluster_is_not_checked():
    ok = ClusterConfig(nodes=2, gpus_per_node=8, tasks_per_node=8, cpus_per_task=8, mem_gb=480, account="proj",
                       qos="high", constraint="a100", timeout_min=2880)
    assert check_resources(ok, run=fake_cluster) == "gpu"
    assert check_resources(ok, run=lambda cmd: None) is None
    assert minutes("1-02:03:00") == 1563 and minutes("0:10:30") == 11 and minutes("UNLIMITED") is None and minutes("30") == 30
    assert gpu_count("gpu:a100:4(S:0-1),gpu:h100:2") == 6 and gpu_count("(null)") == 0


def test_a_requeued_job_always_continues_its_own_run_directory(tmp_path: Path):
    base = ["router.top_k=2", "train.resume=/old/run/checkpoints/step_0000100"]
    # before its first checkpoint: a branch starts again (the partial attempt moved aside), a plain run restarts
    assert requeue_overrides(base, tmp_path) == base + ["train.overwrite=true"]
    assert requeue_overrides(["router.top_k=2"], tmp_path) == ["router.top_k=2", "train.resume=auto"]
    assert requeue_overrides(["router.top_k=2"], None) == ["router.top_k=2", "train.resume=auto"]
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step_0000004.pt").write_bytes(b"")  # after it: its own checkpoint
    assert requeue_overrides(base, tmp_path) == ["router.top_k=2", "train.resume=auto"]
