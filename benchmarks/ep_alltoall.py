"""Expert-parallel exchange vs expert compute: is there time to hide the all-to-all?

    python -m benchmarks.ep_alltoall [--nproc N] [--tokens 1024,4096,16384] [--repeats 10]
                                     [--d-model D] [--hidden H] [--experts E] [--top-k K]
                                     [--dtype fp32|bf16] [--dispatch sorted] [--out results.json]
    torchrun --nproc_per_node=N -m benchmarks.ep_alltoall ...     # or launched by torchrun

Every rank holds E / N experts (distributed=ep with ep_size = N) and T tokens routed top-K
by random softmax logits. One MoE forward through `moe/distributed/expert_parallel.py` is
timed stage by stage, exactly the code training runs:

    plan      sort the assignments by expert + exchange the per-expert counts (small
              all_to_all_single, one host sync for the split sizes)
    dispatch  the token rows to the ranks owning their experts (uneven all_to_all_single)
    experts   the local experts on the received rows (the configured dispatch)
    combine   the outputs back to their tokens' ranks (the reverse all_to_all_single)

Each figure is the median over the repeats of the slowest rank (a step waits for it).
`exchange / compute` = (plan + dispatch + combine) / experts: below 1 the exchange could be
hidden entirely behind expert compute (e.g. chunking the tokens and overlapping chunk i's
exchange with chunk i-1's experts, or the dense layers of the next micro-batch); above 1 the
exchange bounds the layer. The backward pass repeats both exchanges in reverse with ~2x the
compute. Not launched by torchrun, it spawns N processes itself (N = the CUDA devices, else
2 CPU processes on gloo). With one device the "exchange" is a self-copy through the backend:
a floor, not a network measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from moe import cli
from moe.errors import ConfigError
from moe.distributed.expert_parallel import all_to_all, plan_exchange, run_local_experts
from moe.experts import EXPERT_DISPATCH, SwiGLUExperts

DEFAULTS = {  # device type -> per-rank token counts, d_model, expert hidden, experts, top_k, dtype
    "cpu": dict(tokens="256,1024,4096", d_model=128, hidden=256, experts=8, top_k=2, dtype="fp32"),
    "cuda": dict(tokens="4096,16384,65536", d_model=2048, hidden=1024, experts=64, top_k=8, dtype="bf16"),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device, repeats: int, warmup: int = 3) -> tuple[float, object]:
    """(median seconds of the slowest rank, last result)."""
    times, out = [], None
    for i in range(warmup + repeats):
        _sync(device)
        dist.barrier()
        t = time.perf_counter()
        out = fn()
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t)
    med = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return float(med), out


def bench(args, device: torch.device) -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    E, K, D, H = args.experts, args.top_k, args.d_model, args.hidden
    if E % world:
        raise SystemExit(f"--experts={E} must be divisible by the {world} processes")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    g = torch.Generator().manual_seed(1234 + rank)
    experts = SwiGLUExperts(E // world, D, H, args.dispatch)
    with torch.no_grad():
        experts.gate_up_proj.copy_(torch.randn(experts.gate_up_proj.shape, generator=g) / D ** 0.5)
        experts.down_proj.copy_(torch.randn(experts.down_proj.shape, generator=g) / H ** 0.5)
    experts.to(device=device, dtype=dtype)
    group = dist.group.WORLD
    rows = []
    for T in [int(t) for t in args.tokens.split(",")]:
        x = torch.randn(T, D, generator=g).to(device, dtype)
        logits = torch.randn(T, E, generator=g).to(device)
        weights, experts_TK = torch.softmax(logits, -1).topk(K, dim=-1)
        with torch.no_grad():
            t_plan, plan = _timed(lambda: plan_exchange(experts_TK, E, group), device, args.repeats)
            x_send = x[plan.token_idx_N]
            t_disp, x_recv = _timed(lambda: all_to_all(x_send, plan.recv_splits, plan.send_splits, group),
                                    device, args.repeats)
            t_exp, y_recv = _timed(lambda: run_local_experts(experts, x_recv, plan.recv_expert_R), device,
                                   args.repeats)
            t_comb, _ = _timed(lambda: all_to_all(y_recv, plan.send_splits, plan.recv_splits, group), device,
                               args.repeats)
        sent = torch.tensor([x_send.numel() * x_send.element_size() * 2], dtype=torch.float64, device=device)
        dist.all_reduce(sent, op=dist.ReduceOp.MAX)
        exchange = t_plan + t_disp + t_comb
        rows.append(dict(tokens_per_rank=T, rows_per_rank=T * K, plan_ms=1e3 * t_plan, dispatch_ms=1e3 * t_disp,
                         experts_ms=1e3 * t_exp, combine_ms=1e3 * t_comb, exchange_over_compute=exchange / t_exp,
                         exchange_GBps=float(sent) / (t_disp + t_comb) / 1e9 if t_disp + t_comb > 0 else float("nan"),
                         expert_TFLOPs=6 * T * K * D * H / t_exp / 1e12))
    return rows


def _device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def run(local_rank: int, args) -> None:
    device = _device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
    rows = bench(args, device)
    if dist.get_rank() == 0:
        world = dist.get_world_size()
        name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                else f"CPU ({torch.get_num_threads()} threads/rank)")
        print(f"\nexpert-parallel MoE forward: {world} rank(s) x {args.experts // world} experts, "
              f"d_model {args.d_model}, hidden {args.hidden}, top-{args.top_k}, {args.dtype}, "
              f"{dist.get_backend()} on {name}; median of {args.repeats}, slowest rank")
        hdr = f"{'tokens/rank':>11} {'plan ms':>8} {'dispatch ms':>11} {'experts ms':>10} {'combine ms':>10} " \
              f"{'exch/comp':>9} {'exch GB/s':>9} {'expert TFLOP/s':>14}"
        print(hdr)
        for r in rows:
            print(f"{r['tokens_per_rank']:>11} {r['plan_ms']:>8.3f} {r['dispatch_ms']:>11.3f} {r['experts_ms']:>10.3f} "
                  f"{r['combine_ms']:>10.3f} {r['exchange_over_compute']:>9.2f} {r['exchange_GBps']:>9.2f} "
                  f"{r['expert_TFLOPs']:>14.3f}")
        if args.out:
            Path(args.out).write_text(json.dumps({"world_size": world, "device": name, "args": vars(args),
                                                  "rows": rows}, indent=2))
    dist.barrier()
    dist.destroy_process_group()


def _spawned(local_rank: int, world: int, port: int, args) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    run(local_rank, args)


@cli.guarded
def main(argv=None) -> None:
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    d = DEFAULTS[kind]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=None, help="processes to spawn (default: CUDA devices, or 2)")
    p.add_argument("--tokens", default=d["tokens"], help="comma-separated tokens per rank")
    p.add_argument("--d-model", type=int, default=d["d_model"])
    p.add_argument("--hidden", type=int, default=d["hidden"])
    p.add_argument("--experts", type=int, default=d["experts"])
    p.add_argument("--top-k", type=int, default=d["top_k"])
    p.add_argument("--dtype", default=d["dtype"], choices=["fp32", "bf16"])
    p.add_argument("--dispatch", default="sorted", help="experts.name of the local expert compute")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default=None, help="also write the rows as JSON")
    args = p.parse_args(argv)
    EXPERT_DISPATCH.get(args.dispatch)  # an unknown or unavailable name: one line here, not in every rank
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # launched by torchrun
        run(int(os.environ.get("LOCAL_RANK", "0")), args)
        return
    world = args.nproc or (torch.cuda.device_count() if kind == "cuda" else 2)
    if args.experts % world:  # here, once, rather than in every spawned rank
        raise ConfigError(f"--experts={args.experts} must be divisible by the {world} processes (--nproc)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_spawned, args=(world, port, args), nprocs=world, join=True)


if __name__ == "__main__":
    raise SystemExit(main())
