"""Forward + backward time of one MoE layer's experts, every dispatch variant next to HF Mixtral's.

    python -m benchmarks.moe_layer [--device cpu|cuda|auto] [--shapes tiny,small] [--dtypes fp32,bf16]
                                   [--repeats 7] [--variants loop,sorted,...] [--out results.json] [--profile]

All variants get the same inputs: the same expert weights (our `SwiGLUExperts` layout is HF's
`MixtralExperts` layout: `gate_up_proj [E, 2H, D]`, `down_proj [E, D, H]`), the same tokens and
the same routing (softmax top-k of random logits, renormalised, as Mixtral). One timed step is
`y = experts(x, experts_TK, weights_TK); y.backward(dy)` with gradients for x, the router weights
and both weight tensors, as in training. Variants run round-robin (so machine noise hits all
alike) and the figure is the median over the repeats.

Variants: our registered dispatches (`loop`, `sorted`, any newer one; `triton` only on CUDA) and
HF transformers' `MixtralExperts` with its experts implementations `eager` (a loop over the hit
experts) and `grouped_mm` (sort + `torch.nn.functional.grouped_mm`), selected through
`config._experts_implementation` (what `experts_implementation=` / `set_experts_implementation`
set). The ratio column is HF's best time over the variant's time (> 1: faster than HF).

CPU: fp32, and bf16 autocast with fp32 weights (what `train.dtype=bf16` runs; note that HF's
`grouped_mm` path is not autocast-aware and keeps fp32 there). CUDA: bf16 weights and inputs at
16k tokens, 64 experts, top-8; TFLOP/s counts the six expert GEMMs of forward + backward
(18 * T * K * D * H FLOPs) against the device's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import torch

from moe import cli
from moe.errors import ConfigError
from moe.experts import EXPERT_DISPATCH
from moe.perf import measure_matmul_peak

# name: (tokens, d_model, expert_hidden, n_experts, top_k)
SHAPES = {
    "tiny": (2048, 128, 128, 8, 2),  # configs/model/tiny.yaml at the default 16 x 128 batch
    "small": (1024, 512, 768, 8, 2),  # configs/model/small.yaml, an 8 x 128 micro-batch
    "gpu1k": (16384, 1024, 512, 64, 8),  # fine-grained experts, 16k tokens
    "gpu2k": (16384, 2048, 1024, 64, 8),
}
DEFAULT_SHAPES = {"cpu": "tiny,small", "cuda": "gpu1k,gpu2k"}
# dense bf16 tensor-core peaks (FLOP/s) by device-name substring; else the measured matmul peak
BF16_PEAKS = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12, "L40S": 362e12,
              "L4": 121e12, "A10G": 70e12, "RTX 4090": 165e12, "B200": 2250e12, "GH200": 989e12}


def bf16_peak(device: torch.device) -> tuple[float, str]:
    name = torch.cuda.get_device_name(device)
    for key in sorted(BF16_PEAKS, key=len, reverse=True):
        if key in name:
            return BF16_PEAKS[key], f"{name} datasheet"
    return measure_matmul_peak("cuda", "bf16"), f"{name} measured matmul"


def make_inputs(shape, device, dtype, seed=0):
    T, D, H, E, K = shape
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g)
    logits = torch.randn(T, E, generator=g)
    w, experts = torch.softmax(logits, -1).topk(K, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    gate_up = torch.randn(E, 2 * H, D, generator=g) / D ** 0.5
    down = torch.randn(E, D, H, generator=g) / H ** 0.5
    return dict(x=x.to(device, dtype), experts=experts.to(device), weights=w.to(device),
                gate_up=gate_up.to(device, dtype), down=down.to(device, dtype))


class Variant:
    """One way of running the experts: holds its own leaf copies of the shared inputs."""

    def __init__(self, name, inputs, hf_impl=None):
        self.name = name
        self.x = inputs["x"].clone().requires_grad_(True)
        self.weights = inputs["weights"].clone().requires_grad_(True)
        self.experts = inputs["experts"]
        if hf_impl is None:
            self.gate_up = inputs["gate_up"].clone().requires_grad_(True)
            self.down = inputs["down"].clone().requires_grad_(True)
            fn = EXPERT_DISPATCH.get(name)
            self.run = lambda: fn(self.x, self.experts, self.weights, self.gate_up, self.down)
        else:
            from transformers import MixtralConfig
            from transformers.models.mixtral.modeling_mixtral import MixtralExperts
            E, D2H = inputs["gate_up"].shape[0], inputs["gate_up"].shape
            cfg = MixtralConfig(hidden_size=D2H[2], intermediate_size=D2H[1] // 2, num_local_experts=E,
                                num_experts_per_tok=self.experts.shape[1])
            cfg._experts_implementation = hf_impl
            mod = MixtralExperts(cfg).to(inputs["x"].device)
            with torch.no_grad():
                mod.gate_up_proj.data = inputs["gate_up"].clone()
                mod.down_proj.data = inputs["down"].clone()
            self.mod = mod
            self.gate_up, self.down = mod.gate_up_proj, mod.down_proj
            self.run = lambda: mod(self.x, self.experts, self.weights)
        self.leaves = [self.x, self.weights, self.gate_up, self.down]

    def step(self, dy):
        for t in self.leaves:
            t.grad = None
        y = self.run()
        y.backward(dy.to(y.dtype))
        return y


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_agreement(variants, dy, autocast) -> dict:
    """Max |difference| of each variant's output and gradients to the first one's (a sanity check)."""
    out = {}
    ref = None
    for v in variants:
        with autocast():
            y = v.step(dy)
        vals = [y.detach().float()] + [t.grad.float() for t in v.leaves]
        if ref is None:
            ref = vals
        scale = [r.abs().max().clamp_min(1e-12) for r in ref]
        out[v.name] = max(float((a - b).abs().max() / s) for a, b, s in zip(vals, ref, scale))
    return out


def bench_one(shape_name, device, dtype_name, names, repeats, warmup, profile=False) -> dict:
    shape = SHAPES[shape_name]
    T, D, H, E, K = shape
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if (cuda and dtype_name == "bf16") else torch.float32
    use_autocast = dtype_name == "bf16" and not cuda
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if use_autocast else contextlib.nullcontext
    inputs = make_inputs(shape, device, dtype)
    dy = torch.randn(T, D, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    variants = []
    for n in names:
        if n.startswith("hf_"):
            variants.append(Variant(n, inputs, hf_impl=n[3:]))
        else:
            variants.append(Variant(n, inputs))
    agreement = check_agreement(variants, dy, autocast)
    times = {v.name: [] for v in variants}
    cpu_times = {v.name: [] for v in variants}
    for i in range(warmup + repeats):
        order = variants if i % 2 == 0 else variants[::-1]
        for v in order:
            _sync(device)
            t, c = time.perf_counter(), time.process_time()
            with autocast():
                v.step(dy)
            _sync(device)
            if i >= warmup:
                times[v.name].append(time.perf_counter() - t)
                cpu_times[v.name].append(time.process_time() - c)
    flops = 18 * T * K * D * H
    row = {"shape": shape_name, "tokens": T, "d_model": D, "hidden": H, "n_experts": E, "top_k": K,
           "dtype": dtype_name + (" autocast" if use_autocast else ""), "flops_fwd_bwd": flops, "variants": {}}
    hf_best = min((statistics.median(ts) for n, ts in times.items() if n.startswith("hf_")), default=None)
    hf_best_cpu = min((statistics.median(ts) for n, ts in cpu_times.items() if n.startswith("hf_")), default=None)
    for n, ts in times.items():
        med, cpu = statistics.median(ts), statistics.median(cpu_times[n])
        row["variants"][n] = {"median_s": med, "min_s": min(ts), "times_s": ts, "tflops": flops / med / 1e12,
                              "cpu_median_s": cpu, "cpu_times_s": cpu_times[n],
                              "vs_hf_best": (hf_best / med) if hf_best else None,
                              "cpu_vs_hf_best": (hf_best_cpu / cpu) if hf_best_cpu else None,
                              "max_rel_diff_vs_first": agreement[n]}
    if cuda:
        peak, src = bf16_peak(device)
        row["peak_flops"], row["peak_source"] = peak, src
        for r in row["variants"].values():
            r["pct_of_peak"] = 100 * r["tflops"] * 1e12 / peak
    if profile:
        run_profile(variants, dy, autocast, device)
    return row


def run_profile(variants, dy, autocast, device) -> None:
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for v in variants:
        with profile(activities=acts) as prof:
            for _ in range(3):
                with autocast():
                    v.step(dy)
        print(f"\n== profile: {v.name} ==")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def to_markdown(res: dict) -> str:
    cpu = res["device"] == "cpu"
    lines = [f"device: {res['device']}, {res['threads']} threads, median of {res['repeats']} fwd+bwd steps"
             + (" (CPU ms: process CPU time, robust when other jobs share the cores)" if cpu else ""), "",
             "| shape (T, D, H, E, K) | dtype | variant | median ms | TFLOP/s | vs HF best |"
             + (" CPU ms | vs HF best (CPU) |" if cpu else "") + " max rel diff |",
             "|---|---|---|---|---|---|" + ("---|---|" if cpu else "") + "---|"]
    for row in res["rows"]:
        shp = f"{row['shape']} ({row['tokens']}, {row['d_model']}, {row['hidden']}, {row['n_experts']}, {row['top_k']})"
        for n, r in row["variants"].items():
            tf = f"{r['tflops']:.3f}" + (f" ({r['pct_of_peak']:.0f}%)" if "pct_of_peak" in r else "")
            ratio = f"{r['vs_hf_best']:.2f}x" if r["vs_hf_best"] else "-"
            extra = ""
            if cpu:
                cratio = f"{r['cpu_vs_hf_best']:.2f}x" if r["cpu_vs_hf_best"] else "-"
                extra = f" {1e3 * r['cpu_median_s']:.1f} | {cratio} |"
            lines.append(f"| {shp} | {row['dtype']} | {n} | {1e3 * r['median_s']:.1f} | {tf} | {ratio} |{extra} "
                         f"{r['max_rel_diff_vs_first']:.1e} |")
    return "\n".join(lines)


def default_variants(device) -> list[str]:
    names = [n for n in EXPERT_DISPATCH if n != "triton" or device.type == "cuda"]
    try:
        import transformers  # noqa: F401
        names += ["hf_eager", "hf_grouped_mm"]
    except ImportError:
        print("transformers is not installed: no HF comparison")
    return names


@cli.guarded
def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto")
    p.add_argument("--shapes", default=None, help=f"comma list of {sorted(SHAPES)}")
    p.add_argument("--dtypes", default=None, help="cpu default fp32,bf16 (autocast); cuda default bf16")
    p.add_argument("--variants", default=None, help="comma list; default: every dispatch + hf_eager,hf_grouped_mm")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    device = torch.device("cuda" if (args.device == "auto" and torch.cuda.is_available()) else
                          ("cpu" if args.device == "auto" else args.device))
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.variants.split(",") if args.variants else default_variants(device)
    shapes = (args.shapes or DEFAULT_SHAPES[device.type]).split(",")
    dtypes = (args.dtypes or ("bf16" if device.type == "cuda" else "fp32,bf16")).split(",")
    for s in shapes:
        if s not in SHAPES:
            raise ConfigError(f"--shapes: unknown shape {s!r}; choose from {sorted(SHAPES)}")
    res = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "threads": torch.get_num_threads(), "torch": torch.__version__, "repeats": args.repeats, "rows": []}
    for s in shapes:
        for d in dtypes:
            res["rows"].append(bench_one(s, device, d, names, args.repeats, args.warmup, args.profile))
            print(f"done {s} {d}", flush=True)
    print(to_markdown(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
