"""Expert offloading (`expert_cache=`) against the fully resident engine and against naive
on-demand loading (policy `ondemand`: every expert use copied from the slow tier), at several
residencies (fast-tier slots / experts per layer) and batch sizes.

    python -m benchmarks.offload --out docs/results/offload/cpu.json --plot docs/results/offload/cpu.png

Models are built with random weights from `--models` (no trained checkpoint is needed, so the
run is reproducible anywhere; a random router spreads tokens more evenly than a trained one, so
hit rates here are a pessimistic case). Prompts are random token ids, greedy, `--max-tokens` new
tokens each, no eos. Each configuration runs once untimed, then `--repeats` timed runs; tokens/s
is generated tokens over the wall time of `generate` (prefill included). Every offloaded run's
tokens and log-probabilities are compared with the resident engine's: any difference exits 1.

On a CPU-only machine the slow tier is a memory-mapped file whose pages the kernel keeps cached
after the first read, so a "load" is a memory copy: the figures measure what copying costs
against not copying, not a disk or PCIe transfer (the GPU steps are in benchmarks/gpu_session.sh).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from moe import cli  # noqa: E402
from moe.config import ModelConfig  # noqa: E402
from moe.engine import LLM, SamplingParams  # noqa: E402
from moe.model import Transformer  # noqa: E402
from moe.routing.routers import router_config  # noqa: E402

# name -> (model fields, router top_k). `olmoe_shaped`: OLMoE-1B-7B's routing (64 experts, top-8)
# at a width a 2-core CPU runs in minutes; `small`: configs/model/small.yaml (8 experts, top-2).
MODELS = {
    "small": (dict(d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, n_experts=8, expert_hidden=768), 2),
    "olmoe_shaped": (dict(d_model=512, n_layers=4, n_heads=8, n_kv_heads=4, n_experts=64, expert_hidden=256), 8),
    "tiny": (dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=8, expert_hidden=64), 2),
}


def build(name: str, seed: int) -> Transformer:
    fields, top_k = MODELS[name]
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=512, max_seq_len=256, **fields)
    return Transformer(dataclasses.replace(cfg, router=router_config(top_k=top_k))).eval()


def timed_generate(model, opts: dict, prompts, params, repeats: int, device=None, dtype=None):
    llm = LLM.from_model(copy.deepcopy(model), num_blocks=128, max_num_seqs=len(prompts), device=device, dtype=dtype,
                         **opts)
    outs = [(o.token_ids, o.logprobs) for o in llm.generate(prompts, params)]  # warm-up (and the check)
    llm.reset_stats()
    seconds = []
    for _ in range(repeats):
        llm.reset_prefix_cache()  # every repeat prefills its prompts again
        t = time.perf_counter()
        llm.generate(prompts, params)  # (returns after the last step's tokens reached the host: no sync needed)
        seconds.append(time.perf_counter() - t)
    return outs, seconds, llm.stats()


def row(model_name, batch, policy, residency, slots, seconds, n_tokens, stats, exact) -> dict:
    tps = [n_tokens / s for s in seconds]
    out = dict(model=model_name, batch=batch, policy=policy, residency=residency, experts_per_layer=slots,
               tokens_per_s=statistics.median(tps), tokens_per_s_all=tps, seconds_all=seconds, exact=exact)
    for key in ("hit_rate", "prefetch_precision", "prefetch_recall", "bytes_per_token", "stall_s", "gather_s"):
        if f"offload/{key}" in stats:
            out[key] = stats[f"offload/{key}"]
    return out


def bench_model(name: str, args) -> list[dict]:
    model = build(name, args.seed)
    fields, top_k = MODELS[name]
    n_experts = fields["n_experts"]
    rows = []
    for batch in args.batch:
        g = torch.Generator().manual_seed(args.seed + batch)
        prompts = [torch.randint(4, 512, (args.prompt_tokens,), generator=g).tolist() for _ in range(batch)]
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=1)
        n_tokens = batch * args.max_tokens
        ref, seconds, stats = timed_generate(model, {}, prompts, params, args.repeats, args.device, args.dtype)
        rows.append(row(name, batch, "resident", 1.0, n_experts, seconds, n_tokens, stats, True))
        print(json.dumps(rows[-1]), flush=True)
        for residency in args.residency:
            slots = round(residency * n_experts)
            if slots < top_k:
                print(f"# {name}: residency {residency} is {slots} experts per layer, below top_k={top_k}: skipped",
                      flush=True)
                continue
            for policy in args.policies:
                opts = {"expert_cache": {"experts_per_layer": slots, "policy": policy}}
                outs, seconds, stats = timed_generate(model, opts, prompts, params, args.repeats, args.device,
                                                      args.dtype)
                rows.append(row(name, batch, policy, residency, slots, seconds, n_tokens, stats, outs == ref))
                print(json.dumps(rows[-1]), flush=True)
    return rows


def plot(rows: list[dict], path: str) -> None:
    import matplotlib  # lazy: only for --plot
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["model"], r["batch"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (model, batch) in zip(axes[0], panels):
        sel = [r for r in rows if r["model"] == model and r["batch"] == batch]
        for policy in sorted({r["policy"] for r in sel} - {"resident"}):
            pts = sorted((100 * r["residency"], r["tokens_per_s"]) for r in sel if r["policy"] == policy)
            ax.plot(*zip(*pts), marker="o", label=policy)
        for r in sel:
            if r["policy"] == "resident":
                ax.axhline(r["tokens_per_s"], color="k", linestyle="--", label="fully resident")
        ax.set_title(f"{model}, batch {batch}")
        ax.set_xlabel("residency (% of experts per layer in the fast tier)")
        ax.set_ylabel("generated tokens / s (median)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.offload", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["small", "olmoe_shaped"], choices=sorted(MODELS))
    p.add_argument("--residency", nargs="+", type=float, default=[0.125, 0.25, 0.5, 1.0])
    p.add_argument("--policies", nargs="+", default=["ondemand", "lru", "lfu", "lookahead"])
    p.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="default: cpu (the model is built there; on cuda the slow tier "
                   "is pinned host memory)")
    p.add_argument("--dtype", default=None, help="default: fp32 on cpu, the engine's default elsewhere")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--out", default=None, help="write the rows and the run's record as JSON here")
    p.add_argument("--plot", default=None, help="write a PNG of tokens/s against residency here")
    return p


def record(args) -> dict:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return dict(command="python -m benchmarks.offload " + " ".join(sys.argv[1:]), commit=commit,
                machine=platform.platform(), cpus=os.cpu_count(), torch=torch.__version__,
                threads=torch.get_num_threads(), load_before=os.getloadavg())


@cli.guarded
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rec = record(args)
    rows = [r for name in args.models for r in bench_model(name, args)]
    rec.update(load_after=os.getloadavg(), rows=rows)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rec, indent=1))
    if args.plot:
        plot(rows, args.plot)
    wrong = [r for r in rows if not r["exact"]]
    for r in wrong:
        print(f"WRONG OUTPUT: {r['model']} batch {r['batch']} {r['policy']} residency {r['residency']} differs "
              "from the fully resident engine", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
