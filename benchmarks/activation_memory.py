"""Activation memory and step time of `train.activation_checkpointing=full` next to `none`.

    python -m benchmarks.activation_memory [--model tiny|small] [--batch 16 --seq 128] [--steps 5]

Both runs are the same model (same weights) on the same batch. "Saved for backward" is the bytes
of every tensor autograd keeps between forward and backward (counted by a
`saved_tensors_hooks` pack hook: with checkpointing, what a block keeps is its inputs, held by
the checkpoint and counted once per block; nothing else of a block is kept). The step time is
the median of `--steps` forward+backward steps, the two modes alternating so machine noise
hits both alike; the figure to read is the ratio. Each step's CPU time (`time.process_time`, user
+ sys of the process) is reported beside its wall time: on a loaded machine the wall time mostly
measures waiting for a core, the CPU time does not. Exits 1 if the loss or any gradient differs
between the two (the recomputation must be the same computation).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from benchmarks.train_throughput import build
from moe import cli
from moe.train.activation_checkpointing import apply_activation_checkpointing


def saved_bytes(model, x) -> tuple[int, torch.Tensor]:
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x, labels=x, return_logits=False).loss
    return total[0], loss


def bench(args) -> dict:
    models = {}
    for mode in ("none", "full"):
        torch.manual_seed(0)
        _, models[mode] = build(args.model, args.vocab)
        apply_activation_checkpointing(models[mode].train(), mode)
    x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(1))
    out = {"model": args.model, "batch": args.batch, "seq_len": args.seq, "threads": torch.get_num_threads()}
    grads = {}
    for mode, model in models.items():
        torch.manual_seed(2)
        nbytes, loss = saved_bytes(model, x)
        loss.backward()
        grads[mode] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        out[f"saved_MiB_{mode}"] = round(nbytes / 2**20, 2)
        out[f"loss_{mode}"] = float(loss.detach())
    out["same_loss_and_grads"] = out["loss_none"] == out["loss_full"] and grads["none"].keys() == grads["full"].keys() \
        and all(torch.equal(grads["none"][n], grads["full"][n]) for n in grads["none"])
    times = {"none": [], "full": []}
    cpu_times = {"none": [], "full": []}
    for _ in range(args.steps):
        for mode, model in models.items():
            t, c = time.perf_counter(), time.process_time()
            model(x, labels=x, return_logits=False).loss.backward()
            times[mode].append(time.perf_counter() - t)
            cpu_times[mode].append(time.process_time() - c)
            model.zero_grad(set_to_none=True)
    for mode in times:
        out[f"step_s_{mode}"] = round(statistics.median(times[mode]), 4)
        out[f"step_cpu_s_{mode}"] = round(statistics.median(cpu_times[mode]), 4)
    out["saved_ratio_full_over_none"] = round(out["saved_MiB_full"] / out["saved_MiB_none"], 4)
    out["time_ratio_full_over_none"] = round(out["step_s_full"] / out["step_s_none"], 3)
    out["cpu_time_ratio_full_over_none"] = round(out["step_cpu_s_full"] / out["step_cpu_s_none"], 3)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.activation_memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", choices=["tiny", "small"])
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    return p


@cli.guarded
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    out = bench(args)
    print(json.dumps(out, indent=2))
    if not out["same_loss_and_grads"]:
        print("error: the checkpointed run's loss or gradients differ from the plain run's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
