"""Training throughput of our model next to HF transformers' Mixtral, same weights, batch, dtype.

    python -m benchmarks.train_throughput [--model tiny|small] [--batch 16 --seq 128] [--steps 20]
                                          [--dtype fp32,bf16] [--out results.json] [--profile]

Both sides run the same training step (forward with labels, backward, fused AdamW step) on
the same batches; the router balance loss is on for both (HF: `output_router_logits=True`,
otherwise it silently skips it). HF uses its best experts implementation on the device
(`grouped_mm`) and SDPA attention. Steps alternate between the two models so that machine
noise hits both alike; the figure is the median step time. MFU is against the measured matmul
peak of the device in that dtype, with one FLOP formula (`Transformer.flops_per_token`) for both.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch
from hydra import compose, initialize_config_dir

from moe import cli
from moe.config import load_config
from moe.model import Transformer
from moe.perf import measure_matmul_peak
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def build(model_name: str, vocab: int, attention: str = "sdpa", experts: str = "sorted"):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        raw = compose(config_name="config", overrides=[f"model={model_name}", f"model.vocab_size={vocab}",
                                                        f"attention={attention}", f"experts={experts}"])
    cfg = load_config(raw)
    return cfg, Transformer(cfg.model)


def hf_twin(model: Transformer, experts_impl: str):
    from moe.hf.convert import to_hf_model  # lazy: transformers (the `hf` extra) is only needed for the peer
    hf = to_hf_model(model, attn_implementation="sdpa")
    if hasattr(hf, "set_experts_implementation"):
        hf.set_experts_implementation(experts_impl)
    return hf.train()


def make_step(model, is_hf: bool, autocast, lr=1e-4):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)

    def step(x):
        with autocast():
            if is_hf:
                loss = model(input_ids=x, labels=x, output_router_logits=True).loss
            else:
                loss = model(x, labels=x, return_logits=False).loss  # as the trainer runs it
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)
    return step


def bench(args) -> dict:
    torch.manual_seed(0)
    cfg, ours = build(args.model, args.vocab)
    ours.train()
    T = args.seq
    batches = [torch.randint(0, args.vocab, (args.batch, T)) for _ in range(4)]
    results = {"model": args.model, "batch": args.batch, "seq_len": T, "threads": torch.get_num_threads(),
               "params": ours.num_params(), "active_params": ours.num_params(active=True), "runs": []}
    fpt = ours.flops_per_token(T)
    for dtype in args.dtype.split(","):
        peak = measure_matmul_peak("cpu", dtype)
        autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if dtype == "bf16" else contextlib.nullcontext
        torch.manual_seed(0)
        _, mine = build(args.model, args.vocab)
        theirs = hf_twin(mine, args.hf_experts)
        mine.train()
        steps = {"ours": make_step(mine, False, autocast), "hf": make_step(theirs, True, autocast)}
        times, cpu = {k: [] for k in steps}, {k: [] for k in steps}
        for i in range(args.warmup + args.steps):
            for name, fn in (steps.items() if i % 2 == 0 else reversed(list(steps.items()))):
                t, c = time.perf_counter(), time.process_time()  # CPU time: robust when other jobs share the cores
                fn(batches[i % len(batches)])
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - t)
                    cpu[name].append(time.process_time() - c)
        row = {"dtype": dtype, "peak_flops": peak}
        for name, ts in times.items():
            med = statistics.median(ts)
            tok_s = args.batch * T / med
            row[name] = {"median_step_s": med, "tokens_per_s": tok_s, "mfu": fpt * tok_s / peak, "step_s": ts,
                         "cpu_median_step_s": statistics.median(cpu[name]), "cpu_step_s": cpu[name]}
        row["speedup_ours_over_hf"] = row["hf"]["median_step_s"] / row["ours"]["median_step_s"]
        row["cpu_speedup_ours_over_hf"] = row["hf"]["cpu_median_step_s"] / row["ours"]["cpu_median_step_s"]
        results["runs"].append(row)
        if args.profile:
            profile(steps, batches[0])
    return results


def profile(steps, x) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile
    for name, fn in steps.items():
        with tprofile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                fn(x)
        print(f"\n== profile: {name} ==")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


def to_markdown(res: dict) -> str:
    lines = [f"model={res['model']} ({res['params'] / 1e6:.2f}M params, {res['active_params'] / 1e6:.2f}M active), "
             f"batch {res['batch']} x {res['seq_len']}, {res['threads']} threads", "",
             "| dtype | ours tok/s | HF Mixtral tok/s | ours / HF | ours / HF (CPU time) | ours MFU | HF MFU "
             "| matmul peak GFLOP/s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        lines.append(f"| {r['dtype']} | {r['ours']['tokens_per_s']:,.0f} | {r['hf']['tokens_per_s']:,.0f} | "
                     f"{r['speedup_ours_over_hf']:.2f}x | {r['cpu_speedup_ours_over_hf']:.2f}x | {100 * r['ours']['mfu']:.1f}% | {100 * r['hf']['mfu']:.1f}% | "
                     f"{r['peak_flops'] / 1e9:.0f} |")
    return "\n".join(lines)


@cli.guarded
def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", choices=sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml")))
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--dtype", default="fp32,bf16")
    p.add_argument("--hf-experts", default="grouped_mm", help="HF experts implementation (eager|grouped_mm|batched_mm)")
    p.add_argument("--out", default=None)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    res = bench(args)
    print(to_markdown(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
