"""moe/cluster/slurm_limits.py's readers of SLURM's output, field by field (what the resource checks
of tests/cluster/test_slurm_watch.py build on), and `run_command` on real processes."""

from __future__ import annotations

import getpass

import pytest

from moe.cluster.slurm_limits import Node, associations, check_resources, nodes, run_command
from moe.config import ClusterConfig
from moe.errors import ConfigError

SINFO_FORMAT = ["sinfo", "-h", "-N", "-p", "gpu", "-o", "%N|%c|%m|%G|%f"]


def answering(output, calls: list):
    def run(cmd):
        calls.append(cmd)
        return output
    return run


def test_nodes_reads_each_field_of_sinfo():
    calls = []
    out = ("g1|64+|512000+|gpu:a100:8(S:0-1)|a100,ib\n"  # '+': SLURM's "at least" on a node range
           "g2|32|N/A|gpu:2|x\n"                        # a node listed twice (two partitions' lines): the last wins
           "g2|32|1000|gpu:2|x\n"
           "g3|N/A|100|gpu:1|a\n"                       # no CPU count: not a usable node
           "g4|8\n"                                     # short line: the missing fields are empty
           "g5|4|N/A|(null)|(null)\n"                   # memory not a number, no GPUs, no features
           "|8|1|gpu:1|a\n")                            # no name
    assert nodes("gpu", run=answering(out, calls)) == [
        Node("g1", 64, 512000, 8, {"a100", "ib"}), Node("g2", 32, 1000, 2, {"x"}), Node("g4", 8, 0, 0, set()),
        Node("g5", 4, 0, 0, set())]
    assert calls == [SINFO_FORMAT]
    assert nodes("gpu", run=answering(None, [])) == []


def test_associations_reads_account_and_qos_lists():
    calls = []
    out = "proj|normal,high\n\nsolo|\nbare\nx|,a,\n"
    assert associations(answering(out, calls)) == [("proj", {"normal", "high"}), ("solo", set()), ("bare", set()),
                                                   ("x", {"a"})]
    assert calls == [["sacctmgr", "-n", "-P", "show", "assoc", f"user={getpass.getuser()}", "format=account,qos"]]
    assert associations(answering(None, [])) is None


def fake(sinfo: str, assoc: str = ""):
    part = "PartitionName=gpu Default=YES State=UP\n"
    return lambda cmd: {"scontrol": part, "sinfo": sinfo, "sacctmgr": assoc}[cmd[0]]


def test_cpus_per_node_are_tasks_times_cpus_per_task():
    run = fake("g1|16|1000|gpu:8|a\n")
    assert check_resources(ClusterConfig(tasks_per_node=4, cpus_per_task=4, gpus_per_node=0), run=run) == "gpu"
    with pytest.raises(ConfigError) as e:
        check_resources(ClusterConfig(tasks_per_node=4, cpus_per_task=5, gpus_per_node=0), run=run)
    assert str(e.value) == ("cluster.cpus_per_task=5 x cluster.tasks_per_node=4 = 20 CPUs per node: "
                            "the nodes of partition gpu have at most 16 CPUs")


def test_an_unknown_account_is_named_with_the_users_accounts():
    with pytest.raises(ConfigError) as e:
        check_resources(ClusterConfig(account="other", gpus_per_node=0), run=fake("g1|16|1000|gpu:8|a\n", "b|\na|\n"))
    assert str(e.value) == (f"cluster.account=other: you ({getpass.getuser()}) have no association with it on "
                            "this cluster (your accounts: a, b)")


def test_run_command_returns_stdout_or_none():
    assert run_command(["sh", "-c", "echo ok; echo warning >&2"]) == "ok\n"
    assert run_command(["sh", "-c", "echo partial; exit 3"]) is None  # a failing command
    assert run_command(["/nonexistent/sinfo"]) is None  # a missing one
    assert run_command(["sleep", "5"], timeout_s=0.2) is None
