"""A sweep's resources checked against the SLURM cluster itself, before anything is submitted.

sbatch accepts many requests no node can ever satisfy: the job then pends forever
(`PartitionConfig`, `PartitionTimeLimit`) or sbatch refuses it with a message that submitit turns
into a traceback. Here the cluster is asked what it has (`scontrol show partition -o`, `sinfo -N`,
`sacctmgr show assoc` where accounting is readable) and each field of `cluster.*` is compared with
it; a request no node or partition can satisfy is one line naming the field and the cluster's
limit (`ConfigError`). Only limits the cluster reports are checked; a command that is missing or
fails means "unknown" and the check is left to sbatch.
"""

from __future__ import annotations

import getpass
import re
import subprocess
from dataclasses import dataclass
from typing import Callable, Optional

from moe.errors import ConfigError

Run = Callable[[list[str]], Optional[str]]  # a command's stdout, or None when it failed or is missing


def run_command(cmd: list[str], timeout_s: float = 30) -> Optional[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


@dataclass
class Node:
    name: str
    cpus: int
    mem_mb: int
    gpus: int
    features: set


def parse_key_values(line: str) -> dict[str, str]:
    """`scontrol show ... -o` output: one record per line, `Key=Value` separated by spaces."""
    return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", line))


def minutes(slurm_time: str) -> Optional[int]:
    """SLURM's `[days-]hours:minutes:seconds` (or `minutes`) as minutes; None for UNLIMITED/INFINITE."""
    if not slurm_time or slurm_time.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    days, _, rest = slurm_time.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if len(parts) == 1:
        h, m, s = 0, parts[0], 0
    else:
        h, m, s = ([0] * (3 - len(parts)) + parts)[-3:]
    return int(days or 0) * 1440 + h * 60 + m + (s > 0)


def gpu_count(gres: str) -> int:
    """GPUs in a node's GRES (`gpu:8`, `gpu:a100:4(S:0-1),gpu:h100:2`, `(null)`)."""
    total = 0
    for item in gres.split(","):
        m = re.match(r"gpu(?::[^:(]+)?:(\d+)", item.strip())
        if m:
            total += int(m.group(1))
    return total


def partitions(run: Run = run_command) -> Optional[dict[str, dict[str, str]]]:
    out = run(["scontrol", "show", "partition", "-o"])
    if out is None:
        return None
    parts = [parse_key_values(line) for line in out.splitlines() if line.startswith("PartitionName=")]
    return {p["PartitionName"]: p for p in parts}


def nodes(partition: str, run: Run = run_command) -> list[Node]:
    out = run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%c|%m|%G|%f"]) or ""
    found = {}
    for line in out.splitlines():
        name, cpus, mem, gres, feats = (line.split("|") + [""] * 5)[:5]
        if name and cpus.rstrip("+").isdigit():
            found[name] = Node(name, int(cpus.rstrip("+")), int(mem.rstrip("+") or 0) if mem.rstrip("+").isdigit()
                               else 0, gpu_count(gres), set(feats.split(",")) - {"(null)", ""})
    return list(found.values())


def associations(run: Run = run_command) -> Optional[list[tuple[str, set]]]:
    """(account, QOS names) of this user's associations; None when accounting cannot be read."""
    out = run(["sacctmgr", "-n", "-P", "show", "assoc", f"user={getpass.getuser()}", "format=account,qos"])
    if out is None:
        return None
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return [(r[0], set(filter(None, r[1].split(",")) if len(r) > 1 else set())) for r in rows]


def _choose_partition(c, parts: dict) -> tuple[str, dict]:
    if c.partition is None:
        default = [p for p in parts.values() if p.get("Default") == "YES"]
        if not default:
            raise ConfigError(f"cluster.partition is not set and the cluster has no default partition; "
                              f"set one of: {', '.join(sorted(parts))}")
        return default[0]["PartitionName"], default[0]
    if c.partition not in parts:
        raise ConfigError(f"cluster.partition={c.partition}: no such partition on this cluster "
                          f"(partitions: {', '.join(sorted(parts))})")
    part = parts[c.partition]
    if part.get("State", "UP") != "UP":
        raise ConfigError(f"cluster.partition={c.partition} is {part['State']} (jobs would never start)")
    return c.partition, part


def _check_partition_limits(c, name: str, part: dict) -> None:
    max_time = minutes(part.get("MaxTime", ""))
    if max_time is not None and c.timeout_min > max_time:
        raise ConfigError(f"cluster.timeout_min={c.timeout_min}: partition {name} allows at most {max_time} minutes "
                          f"(MaxTime={part['MaxTime']})")
    limits = [("MaxNodes", part.get("MaxNodes")), ("TotalNodes", part.get("TotalNodes"))]
    for key, value in limits:
        if value and value.isdigit() and c.nodes > int(value):
            raise ConfigError(f"cluster.nodes={c.nodes}: partition {name} allows at most {value} nodes ({key})")
    max_mem = part.get("MaxMemPerNode", "UNLIMITED")
    if c.mem_gb is not None and max_mem.isdigit() and c.mem_gb * 1024 > int(max_mem):
        raise ConfigError(f"cluster.mem_gb={c.mem_gb}: partition {name} allows at most {int(max_mem) // 1024} GB "
                          f"per node (MaxMemPerNode={max_mem} MB)")


def _check_nodes(c, name: str, found: list[Node]) -> None:
    """Is there a node in the partition with the GPUs, CPUs and memory one node of the job asks for
    (and `cluster.nodes` of them)?"""
    if not found:
        return
    cpus = c.cpus_per_task * c.tasks_per_node
    checks = [("gpus_per_node", c.gpus_per_node, lambda n: n.gpus, "GPUs"),
              ("cpus_per_task", cpus, lambda n: n.cpus, "CPUs"),
              ("mem_gb", (c.mem_gb or 0) * 1024, lambda n: n.mem_mb, "MB of memory")]
    for field_name, wanted, has, unit in checks:
        if wanted and not any(has(n) >= wanted for n in found):
            best = max(has(n) for n in found)
            what = (f"cluster.cpus_per_task={c.cpus_per_task} x cluster.tasks_per_node={c.tasks_per_node} = {cpus} "
                    "CPUs per node" if field_name == "cpus_per_task" else f"cluster.{field_name}={getattr(c, field_name)}")
            raise ConfigError(f"{what}: the nodes of partition {name} have at most {best} {unit}")
    # A plain feature name is checked; an expression (`a100|h100`, `[rack1*2]`) is left to SLURM.
    feature = c.constraint if c.constraint and re.fullmatch(r"[\w-]+", c.constraint) else None
    if feature and not any(feature in n.features for n in found):
        feats = sorted({f for n in found for f in n.features})
        raise ConfigError(f"cluster.constraint={feature}: no node of partition {name} has that feature "
                          f"(features: {', '.join(feats) or 'none'})")
    fit = [n for n in found if n.gpus >= c.gpus_per_node and n.cpus >= cpus and n.mem_mb >= (c.mem_gb or 0) * 1024
           and (feature is None or feature in n.features)]
    if len(fit) < c.nodes:
        raise ConfigError(f"cluster.nodes={c.nodes}: partition {name} has {len(fit)} node(s) with the GPUs, CPUs "
                          "and memory one node of the job asks for")


def _check_account(c, assoc: Optional[list]) -> None:
    if not assoc:  # accounting not readable, or no associations recorded (then SLURM does not enforce them)
        return
    accounts = sorted({a for a, _ in assoc})
    if c.account is not None and c.account not in accounts:
        raise ConfigError(f"cluster.account={c.account}: you ({getpass.getuser()}) have no association with it on "
                          f"this cluster (your accounts: {', '.join(accounts)})")
    if c.qos is not None:
        allowed = sorted({q for a, qos in assoc if c.account in (None, a) for q in qos})
        if allowed and c.qos not in allowed:
            raise ConfigError(f"cluster.qos={c.qos}: not allowed for your association on this cluster "
                              f"(allowed: {', '.join(allowed)})")


def check_resources(c, run: Run = run_command) -> Optional[str]:
    """Check `c` (a ClusterConfig) against the cluster; returns the partition the jobs go to (None
    when the cluster could not be asked). Raises ConfigError naming the field and the limit."""
    parts = partitions(run)
    if not parts:
        return None
    name, part = _choose_partition(c, parts)
    _check_partition_limits(c, name, part)
    _check_nodes(c, name, nodes(name, run))
    _check_account(c, associations(run))
    return name
