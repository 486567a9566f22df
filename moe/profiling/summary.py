"""What a recorded window says, as plain data: the time in each named stage and the top
operators (from torch.profiler's `key_averages`), and the console text of both."""

from __future__ import annotations

from moe.profiling.ranges import STAGES
from moe.report import markdown_table

US_PER_MS = 1000.0


def _ms(us: float) -> float:
    return round(us / US_PER_MS, 3)


TOP_LEVEL = ("forward", "backward", "optimizer")  # a training (or engine) step's own ranges


def _in_a_step(event, step_threads: set) -> bool:
    """Whether a model stage ran as part of a step: inside a `forward` / `backward` range, or on
    a thread that runs no `forward` (the autograd engine's device threads run backward there).
    Leaves out the model calls outside the step: validation, the routing probes."""
    if event.name in TOP_LEVEL or event.thread not in step_threads:
        return True
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in ("forward", "backward"):
            return True
        parent = parent.cpu_parent
    return False


def stage_totals(events, n_steps: int) -> dict:
    """Per stage: calls, the CPU time inside its ranges, the device (GPU) time of the kernels
    launched inside them (0 on CPU), in total and per recorded step. Times are inclusive
    (`forward` contains `attention`, `routing`, ...), and count only what ran in a step
    (`_in_a_step`). `events`: torch.profiler's `events()`."""
    step_threads = {e.thread for e in events if e.name == "forward"}
    sums = {name: [0, 0.0, 0.0] for name in STAGES}  # calls, cpu us, device us
    for e in events:
        if e.name in sums and _in_a_step(e, step_threads):
            acc = sums[e.name]
            acc[0], acc[1], acc[2] = acc[0] + 1, acc[1] + e.cpu_time_total, acc[2] + e.device_time_total
    steps = max(n_steps, 1)
    return {name: {"calls": calls, "cpu_ms": _ms(cpu), "device_ms": _ms(dev), "cpu_ms_per_step": _ms(cpu / steps),
                   "device_ms_per_step": _ms(dev / steps)}
            for name, (calls, cpu, dev) in sums.items() if calls}


def _is_operator(key: str) -> bool:
    """Operators, not ranges: the stages and the profiler's own `ProfilerStep#N` ranges are left out."""
    return key not in STAGES and not key.startswith("ProfilerStep")


def top_operators(averages, n: int, on_device: bool) -> list[dict]:
    """The `n` operators with the most self time (device time when kernels ran, else CPU time)."""
    ops = [e for e in averages if _is_operator(e.key)]
    ops.sort(key=lambda e: (e.self_device_time_total if on_device else e.self_cpu_time_total), reverse=True)
    return [{"name": e.key, "calls": e.count, "self_cpu_ms": _ms(e.self_cpu_time_total),
             "cpu_ms": _ms(e.cpu_time_total), "self_device_ms": _ms(e.self_device_time_total),
             "device_ms": _ms(e.device_time_total)}
            for e in ops[:n]]


def memory_operators(averages, n: int) -> list[dict]:
    """The `n` operators that allocated the most memory themselves (profile_memory=True): bytes
    allocated minus freed inside the operator, on the CPU and on the device."""
    ops = [e for e in averages if _is_operator(e.key)]
    ops.sort(key=lambda e: max(e.self_cpu_memory_usage, e.self_device_memory_usage), reverse=True)
    return [{"name": e.key, "calls": e.count, "self_cpu_mb": round(e.self_cpu_memory_usage / 2**20, 3),
             "self_device_mb": round(e.self_device_memory_usage / 2**20, 3)} for e in ops[:n]]


def console_text(report: dict) -> str:
    """Two Markdown tables: the stages (ms per recorded step) and the top operators."""
    steps = report["steps"]
    stages = report["stages"]
    stage_rows = [[name, s["calls"], s["cpu_ms_per_step"], s["device_ms_per_step"]] for name, s in stages.items()]
    op_rows = [[o["name"][:60], o["calls"], o["self_cpu_ms"], o["self_device_ms"]] for o in report["top_ops"]]
    head = f"profile of steps {steps[0]}-{steps[1]} (rank {report['rank']}): trace {report['trace']}"
    return "\n".join([head, markdown_table(["stage", "calls", "cpu ms/step", "device ms/step"], stage_rows,
                                           ["l", "r", "r", "r"], "{:.3f}"),
                      markdown_table(["operator", "calls", "self cpu ms", "self device ms"], op_rows,
                                     ["l", "r", "r", "r"], "{:.3f}")])
