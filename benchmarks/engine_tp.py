"""Tensor-parallel engine on CPU: 2 ranks (gloo) against 1 process, on the `small` model.

    python -m benchmarks.engine_tp --out docs/results/engine_tp/cpu.json [--repeats 3]

The `small` model config (configs/model/small.yaml, 86M parameters, vocabulary 4096, random
weights: speed does not depend on them) is saved as a checkpoint once; each layout then builds an
engine from it and runs the same greedy workload `--repeats` times (after one warm-up pass):

    1 rank, 1 thread      the single-process engine as one core runs it
    1 rank, 2 threads     the single-process engine using both cores (torch's intra-op threads)
    2 ranks, 1 thread     tensor_parallel_size=2 (TP experts), one thread per rank
    2 ranks EP, 1 thread  tensor_parallel_size=2, expert_parallel=True

Reported per repeat: generated tokens/s (wall clock of `generate`), the engine's model time, and
for the 2-rank layouts the part of it rank 0 spent inside collectives (all-reduce, all-gather,
measured around each call: gloo collectives are synchronous, so this includes waiting for the
slower rank). Every layout's greedy tokens must equal the 1-rank run's, else exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from moe.checkpoint import save_checkpoint
from moe.config import Config, ModelConfig, to_dict
from moe.engine import LLM, SamplingParams
from moe.model import Transformer

LAYOUTS = {  # key: (name, threads per rank, engine options); the first is the reference
    "1x1": ("1 rank, 1 thread", 1, {}),
    "1x2": ("1 rank, 2 threads", 2, {}),
    "tp2": ("2 ranks, 1 thread", 1, dict(tensor_parallel_size=2)),
    "ep2": ("2 ranks EP, 1 thread", 1, dict(tensor_parallel_size=2, expert_parallel=True)),
}


def small_checkpoint(directory: Path, vocab: int) -> str:
    fields = yaml.safe_load(Path("configs/model/small.yaml").read_text())
    fields["vocab_size"] = vocab
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**fields))
    return str(save_checkpoint(directory / "small.pt", {"model": model.state_dict(),
                                                        "config": to_dict(Config(model=model.cfg))}))


def run_layout(path: str, threads: int, opts: dict, prompts, params, repeats: int) -> dict:
    torch.set_num_threads(threads)
    llm = LLM(path, device="cpu", dtype="fp32", **opts)
    group = getattr(llm.runner, "group", None)
    llm.generate(prompts, params)  # warm-up
    runs, tokens = [], None
    for _ in range(repeats):
        llm.reset_stats()
        if group is not None:
            group.comm_seconds = 0.0
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        wall = time.perf_counter() - t0
        n = sum(len(o.token_ids) for o in outs)
        stats = llm.stats()
        runs.append(dict(wall_s=wall, tokens=n, tokens_per_s=n / wall, steps=stats["num_steps"],
                         model_time_s=stats["model_time_s"],
                         comm_s=None if group is None else group.comm_seconds, load=os.getloadavg()))
        tokens = [o.token_ids for o in outs]
    llm.shutdown()
    tps = [r["tokens_per_s"] for r in runs]
    return dict(runs=runs, tokens_per_s_median=statistics.median(tps), tokens_per_s_min=min(tps),
                tokens_per_s_max=max(tps), token_ids=tokens)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS),
                    help="which layouts to run (1x1, the reference, always runs first)")
    args = ap.parse_args(argv)
    vocab = 4096
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.num_prompts)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    results = {}
    with tempfile.TemporaryDirectory() as d:
        path = small_checkpoint(Path(d), vocab)
        for key in ["1x1"] + [k for k in args.layouts if k != "1x1"]:
            name, threads, opts = LAYOUTS[key]
            results[name] = run_layout(path, threads, opts, prompts, params, args.repeats)
            print(f"{name}: {results[name]['tokens_per_s_median']:.1f} tokens/s "
                  f"({results[name]['tokens_per_s_min']:.1f}-{results[name]['tokens_per_s_max']:.1f})", flush=True)
    reference = results[LAYOUTS["1x1"][0]]["token_ids"]
    wrong = [name for name, r in results.items() if r["token_ids"] != reference]
    for r in results.values():
        del r["token_ids"]
    record = dict(command="python -m benchmarks.engine_tp " + " ".join(argv if argv is not None else sys.argv[1:]),
                  commit=subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
                  machine=dict(node=platform.node(), cpus=os.cpu_count(), torch=torch.__version__),
                  workload=vars(args), results=results, mismatched_layouts=wrong)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1))
    if wrong:
        print(f"greedy tokens differ from the 1-rank run: {wrong}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
