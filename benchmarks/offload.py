"""Expert offloading (`expert_cache=`) against the fully resident engine and against naive
on-demand loading (policy `ondemand`: every expert use copied from the slow tier), at several
residencies (fast-tier slots / experts per layer) and batch sizes.

    python -m benchmarks.offload --out docs/results/offload/cpu.json --plot docs/results/offload/cpu.png
    python -m benchmarks.offload --models olmoe_hf ckpt:/work/ckpt/default --quantization none int4

`--models` names: one of `MODELS` (our Transformer with random weights), one of `HF_MODELS` (a
random HF model of that config written with `save_pretrained` to a temporary directory and
served through the HF import, `LLM(directory)`), or `ckpt:PATH` (a trained checkpoint or run
directory). Random weights need no checkpoint, so the run is reproducible anywhere; a random
router spreads tokens more evenly than a trained one, so their hit rates are a pessimistic case.
Prompts are random token ids, greedy, `--max-tokens` new tokens each, no eos. Each configuration
runs once untimed, then `--repeats` timed runs; tokens/s is generated tokens over the wall time of
`generate` (prefill included), and tokens per CPU second over the process's user + system time
in it (the prefetch thread included). `--quantization` serves each model quantized (the expert
cache then holds the stored codes and scales). Every offloaded run's tokens and log-probabilities
are compared with the resident engine's of the same quantization: any difference exits 1.

On a CPU-only machine the slow tier is a memory-mapped file whose pages the kernel keeps cached
after the first read, so a "load" is a memory copy: the figures measure what copying costs
against not copying, not a disk or PCIe transfer (the GPU steps are in benchmarks/gpu_session.sh).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import os
import platform
import resource
import statistics
import tempfile
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.timing import finish_record  # noqa: E402
from moe import cli  # noqa: E402
from moe.config import ModelConfig  # noqa: E402
from moe.dtypes import resolve_dtype  # noqa: E402
from moe.engine import LLM, SamplingParams  # noqa: E402
from moe.errors import ConfigError  # noqa: E402
from moe.loading import load_model  # noqa: E402
from moe.model import Transformer  # noqa: E402
from moe.routing.routers import router_config  # noqa: E402

# name -> (model fields, router top_k). `olmoe_shaped`: OLMoE-1B-7B's routing (64 experts, top-8)
# at a width a 2-core CPU runs in minutes; `small`: configs/model/small.yaml (8 experts, top-2).
MODELS = {
    "small": (dict(d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, n_experts=8, expert_hidden=768), 2),
    "olmoe_shaped": (dict(d_model=512, n_layers=4, n_heads=8, n_kv_heads=4, n_experts=64, expert_hidden=256), 8),
    "tiny": (dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=8, expert_hidden=64), 2),
}


# name -> HF config fields. `olmoe_hf`: OLMoE-1B-7B's routing (64 experts, top-8) at a width a loaded
# 2-core CPU runs in minutes; `olmoe_1b7b`: OLMoE-1B-7B's own shape (the GPU step; ~28 GB in fp32 on the host).
HF_MODELS = {
    "olmoe_hf": dict(model_type="olmoe", hidden_size=256, intermediate_size=128, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=4, num_experts=64, num_experts_per_tok=8,
                     vocab_size=512, max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
                     pad_token_id=None),
    "olmoe_1b7b": dict(model_type="olmoe", hidden_size=2048, intermediate_size=1024, num_hidden_layers=16,
                       num_attention_heads=16, num_key_value_heads=16, num_experts=64, num_experts_per_tok=8,
                       vocab_size=50304, max_position_embeddings=4096),
}


def build(name: str, seed: int) -> Transformer:
    fields, top_k = MODELS[name]
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=512, max_seq_len=256, **fields)
    return Transformer(dataclasses.replace(cfg, router=router_config(top_k=top_k))).eval()


def write_hf(name: str, seed: int, directory: str, dtype) -> str:
    """A random HF model of `HF_MODELS[name]` saved to `directory` (weights N(0, 0.02), HF's init), in
    `dtype` (bf16 halves the host memory of the real-size one)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    fields = dict(HF_MODELS[name])
    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    AutoModelForCausalLM.from_config(cfg, dtype=resolve_dtype(dtype or "fp32")).save_pretrained(directory)
    return directory


class Source:
    """One benchmarked model, held on the host: `engine(opts)` builds an engine over a fresh copy.
    An HF directory or checkpoint is read through the loader once (`load_model`, the import `LLM(path)`
    runs), not once per configuration: at OLMoE-1B-7B's size each read is ~14 GB."""

    def __init__(self, name: str, args, workdir: str):
        self.name, self.args = name, args
        if name in MODELS:
            self.model = build(name, args.seed)
            return
        if name in HF_MODELS:
            path = write_hf(name, args.seed, os.path.join(workdir, name), args.dtype)
        else:
            path = name[len("ckpt:"):]
        self.model, _, _ = load_model(path, device="cpu", dtype=args.dtype)

    def engine(self, opts: dict, batch: int) -> LLM:
        return LLM.from_model(copy.deepcopy(self.model), num_blocks=128, max_num_seqs=batch, device=self.args.device,
                              dtype=self.args.dtype, **opts)


def check_model_names(names: list[str]) -> None:
    for name in names:
        if name not in MODELS and name not in HF_MODELS and not (name.startswith("ckpt:") and len(name) > 5):
            raise ConfigError(f"--models {name!r} is unknown: use one of {sorted(MODELS) + sorted(HF_MODELS)} or "
                              "ckpt:PATH")


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed_generate(llm: LLM, prompts, params, repeats: int):
    outs = [(o.token_ids, o.logprobs) for o in llm.generate(prompts, params)]  # warm-up (and the check)
    llm.reset_stats()
    seconds, cpu = [], []
    for _ in range(repeats):
        llm.reset_prefix_cache()  # every repeat prefills its prompts again
        c, t = cpu_seconds(), time.perf_counter()
        llm.generate(prompts, params)  # (returns after the last step's tokens reached the host: no sync needed)
        seconds.append(time.perf_counter() - t)
        cpu.append(cpu_seconds() - c)
    return outs, seconds, cpu, llm.stats()


def row(key: dict, seconds, cpu, n_tokens, stats, exact) -> dict:
    tps = [n_tokens / s for s in seconds]
    out = dict(**key, tokens_per_s=statistics.median(tps), tokens_per_s_all=tps, seconds_all=seconds,
               cpu_s_all=cpu, tokens_per_cpu_s=statistics.median(n_tokens / max(c, 1e-9) for c in cpu), exact=exact)
    for k in ("hit_rate", "prefetch_precision", "prefetch_recall", "bytes_per_token", "stall_s", "gather_s"):
        if f"offload/{k}" in stats:
            out[k] = stats[f"offload/{k}"]
    return out


def bench_model(source: Source, quantization, args) -> list[dict]:
    rows = []
    quant = {} if quantization in (None, "none") else {"quantization": quantization}
    for batch in args.batch:
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=1)
        n_tokens = batch * args.max_tokens
        resident = source.engine(quant, batch)
        cfg = resident.model.cfg
        n_experts, top_k = cfg.n_experts, cfg.router.top_k
        g = torch.Generator().manual_seed(args.seed + batch)
        prompts = [torch.randint(4, min(512, cfg.vocab_size), (args.prompt_tokens,), generator=g).tolist()
                   for _ in range(batch)]
        key = dict(model=source.name, quantization=quantization or "none", batch=batch)
        ref, seconds, cpu, stats = timed_generate(resident, prompts, params, args.repeats)
        del resident
        rows.append(row(dict(key, policy="resident", residency=1.0, experts_per_layer=n_experts), seconds, cpu,
                        n_tokens, stats, True))
        print(json.dumps(rows[-1]), flush=True)
        for residency in args.residency:
            slots = round(residency * n_experts)
            if slots < top_k:
                print(f"# {source.name}: residency {residency} is {slots} experts per layer, below top_k={top_k}: "
                      "skipped", flush=True)
                continue
            for policy in args.policies:
                llm = source.engine(dict(quant, expert_cache={"experts_per_layer": slots, "policy": policy}), batch)
                outs, seconds, cpu, stats = timed_generate(llm, prompts, params, args.repeats)
                llm.offload.close()
                del llm
                gc.collect()  # the engine's slow-tier file and (CUDA) pinned copy go now, not at exit
                rows.append(row(dict(key, policy=policy, residency=residency, experts_per_layer=slots), seconds, cpu,
                                n_tokens, stats, outs == ref))
                print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_sources(source: Source, args) -> list[dict]:
    return [r for q in args.quantization for r in bench_model(source, q, args)]


def plot(rows: list[dict], path: str) -> None:
    """Per (model, quantization, batch): tokens/s against residency, wall (top) and per CPU second
    (bottom: what a loaded machine's wall clock hides), the resident engine as a dashed line."""
    import matplotlib  # lazy: only for --plot
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["model"], r.get("quantization", "none"), r["batch"]) for r in rows})
    measures = [("tokens_per_s", "generated tokens / s, wall (median)")]
    if all("tokens_per_cpu_s" in r for r in rows):
        measures.append(("tokens_per_cpu_s", "generated tokens / CPU s (median)"))
    fig, axes = plt.subplots(len(measures), len(panels), figsize=(4.2 * len(panels), 3.4 * len(measures)),
                             squeeze=False)
    for col, (model, quant, batch) in enumerate(panels):
        sel = [r for r in rows if r["model"] == model and r.get("quantization", "none") == quant and r["batch"] == batch]
        for ax, (key, label) in zip(axes[:, col], measures):
            for policy in sorted({r["policy"] for r in sel} - {"resident"}):
                pts = sorted((100 * r["residency"], r[key]) for r in sel if r["policy"] == policy)
                ax.plot(*zip(*pts), marker="o", label=policy)
            for r in sel:
                if r["policy"] == "resident":
                    ax.axhline(r[key], color="k", linestyle="--", label="fully resident")
            ax.set_title(f"{model.split('/')[-1]}{'' if quant == 'none' else ' ' + quant}, batch {batch}", fontsize=9)
            ax.set_xlabel("residency (% of experts per layer in the fast tier)", fontsize=8)
            ax.set_ylabel(label, fontsize=8)
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.offload", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["small", "olmoe_shaped"],
                   help=f"{sorted(MODELS)} (random), {sorted(HF_MODELS)} (random HF import) or ckpt:PATH")
    p.add_argument("--quantization", nargs="+", default=["none"], help="schemes to serve each model with (none: as stored)")
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
    p.add_argument("--replot", default=None, help="only redraw --plot from this recorded --out JSON (no run)")
    return p


def record(args) -> dict:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return dict(command="python -m benchmarks.offload " + " ".join(sys.argv[1:]), commit=commit,
                machine=platform.platform(), cpus=os.cpu_count(), torch=torch.__version__,
                threads=torch.get_num_threads(), load_before=os.getloadavg())


@cli.guarded
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.replot:
        plot(json.loads(Path(args.replot).read_text())["rows"], args.plot)
        return 0
    check_model_names(args.models)
    if args.threads:
        torch.set_num_threads(args.threads)
    rec = record(args)
    with tempfile.TemporaryDirectory(prefix="bench-offload-") as workdir:
        rows = [r for name in args.models for r in bench_sources(Source(name, args, workdir), args)]
    rec.update(rows=rows)
    if args.plot:
        plot(rows, args.plot)
    wrong = [f"{r['model']} {r['quantization']} batch {r['batch']} {r['policy']} residency {r['residency']} "
             "differs from the fully resident engine" for r in rows if not r["exact"]]
    return finish_record(rec, args.out, wrong)


if __name__ == "__main__":
    sys.exit(main())
