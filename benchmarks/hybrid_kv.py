"""KV blocks a hybrid model holds at a long context, measured: per-group tables against one table.

    PYTHONPATH=$PWD python -m benchmarks.hybrid_kv --context 32768 --repeats 3 \
        --out docs/results/swa_kv/hybrid/results.json --png docs/results/swa_kv/hybrid/blocks.png

Tiny random models (d_model 64, 2 layers), block_size 16, one request of `context` tokens (prompt
`context - gen`, then `gen` greedy tokens, prefill chunks of 1024). Three engines:
- "full": both layers full attention (the all-full model), one table;
- "alternating, one table": layer 0 slides over 128 tokens, layer 1 full, served with one table
  (every block kept: the engine before per-group tables);
- "alternating, per-group": the same model with per-group tables in one shared pool (the engine as
  built: its window group frees what the window passed).
A block of the per-group layout holds one layer of each group (half the bytes of a one-table
block of this 2-layer model), so the record compares KV bytes in use, and blocks in layer units
(blocks x layers per block). The per-group and one-table engines are asserted to emit the same
tokens. Per step the per-group engine's held blocks per group are kept for the plot. "final": what
the pool holds after the last decode step (context - 1 tokens computed); "peak": the most in any
step (during prefill a 1024-token chunk holds its own blocks in the window group too).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import time

import torch

import moe.engine.core.engine as engine_module
from moe.config import ModelConfig
from moe.engine import LLM, SamplingParams
from moe.model import Transformer
from moe.routing.routers import router_config
from tests.conftest import with_variants

WINDOW, BLOCK, CHUNK = 128, 16, 1024


def build_model(layer_types, context: int) -> Transformer:
    torch.manual_seed(0)
    window = WINDOW if "sliding" in layer_types else None
    cfg = ModelConfig(vocab_size=260, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=64,
                      max_seq_len=context, layer_types=list(layer_types), sliding_window=window)
    return Transformer(with_variants(cfg, router_config(top_k=2))).eval()


def engine(model, per_group: bool, num_blocks: int, device: str = "cpu") -> LLM:
    real = engine_module.is_hybrid
    if not per_group:  # the one-table layout (what the engine did before per-group tables)
        engine_module.is_hybrid = lambda cfg: False
    try:
        return LLM.from_model(model, None, attention_backend="torch", device=device, block_size=BLOCK, num_blocks=num_blocks,
                              max_num_seqs=1, max_num_batched_tokens=CHUNK, collect_routing_stats=False,
                              enable_prefix_caching=False, check_invariants=False)
    finally:
        engine_module.is_hybrid = real


def run(name: str, model, per_group: bool, prompt: list[int], gen: int, trace: bool, device: str = "cpu") -> dict:
    context = len(prompt) + gen
    llm = engine(model, per_group, 2 * (context // BLOCK + 16), device)
    layers_per_block = llm.kv_layout.layers_per_block
    bytes_per_block = llm.runner.context.kv[:, :, :1].numel() * llm.runner.context.kv.element_size()
    rid = llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True))
    seq, steps, peak, last = llm.requests[rid], [], 0, 0
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    while llm.has_unfinished_requests():
        out = llm.step()
        peak = max(peak, llm.block_manager.num_used_blocks)
        if llm.has_unfinished_requests():  # (after the last step its blocks are released)
            last = llm.block_manager.num_used_blocks
        if trace and llm.has_unfinished_requests():
            steps.append(dict(tokens=seq.num_computed_tokens, per_group=llm.block_manager.num_held_per_group(seq)))
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    return dict(name=name, per_group=per_group, layers_per_block=layers_per_block, bytes_per_block=bytes_per_block,
                peak_blocks=peak, peak_layer_blocks=peak * layers_per_block, peak_kv_bytes=peak * bytes_per_block,
                final_blocks=last, final_layer_blocks=last * layers_per_block, final_kv_bytes=last * bytes_per_block,
                wall_s=wall, cpu_s=(r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
                tokens=out[-1].output.token_ids, trace=steps)


def plot(steps: list[dict], full_run: dict, path: str) -> None:
    import matplotlib  # lazy: only the --png run needs it
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    x = [s["tokens"] for s in steps]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, [s["per_group"][0] for s in steps], label="full-attention group (layer 1)")
    ax.plot(x, [s["per_group"][1] for s in steps], label=f"sliding group (layer 0, window {WINDOW})")
    ax.plot(x, [s["per_group"][0] + s["per_group"][1] for s in steps], "--", label="pool in use (both groups)")
    ax.plot(x, [2 * -(-t // BLOCK) for t in x], ":", label="one table (every block of both layers kept)")
    ax.set_xlabel("tokens in the sequence (computed)")
    ax.set_ylabel(f"KV blocks held (1 layer x {BLOCK} tokens each)")
    ax.set_title("Hybrid model (1 sliding + 1 full layer): KV blocks per group")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--png", default=None)
    ap.add_argument("--device", default="cpu", help="cpu (the record) or cuda (benchmarks/gpu_session.sh step 40)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(4, 260, (args.context - args.gen,), generator=g).tolist()
    full, alt = build_model(["full", "full"], args.context), build_model(["sliding", "full"], args.context)
    runs, load_before = [], open("/proc/loadavg").read().split()[:3]
    for r in range(args.repeats):
        trio = [run("full", full, False, prompt, args.gen, False, args.device),
                run("alternating, one table", alt, False, prompt, args.gen, False, args.device),
                run("alternating, per-group", alt, True, prompt, args.gen, r == 0, args.device)]
        assert trio[1]["tokens"] == trio[2]["tokens"], "per-group tables changed the outputs"
        for x in trio:
            x.pop("tokens")
            x.update(repeat=r, loadavg=open("/proc/loadavg").read().split()[:3])
            print(json.dumps({k: v for k, v in x.items() if k != "trace"}))
        if r == 0 and args.png:
            plot(trio[2]["trace"], trio[0], args.png)
        runs.extend(trio)
    record = dict(command=f"PYTHONPATH=$PWD python -m benchmarks.hybrid_kv --context {args.context} --gen {args.gen} "
                          f"--repeats {args.repeats} --device {args.device}",
                  commit=subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
                  machine=dict(cpus=os.cpu_count(), torch_threads=1, uname=" ".join(os.uname()), device=args.device,
                               gpu=torch.cuda.get_device_name() if args.device == "cuda" else None),
                  load_before=load_before, load_after=open("/proc/loadavg").read().split()[:3],
                  setup=dict(window=WINDOW, block_size=BLOCK, context=args.context, generated=args.gen,
                             max_num_batched_tokens=CHUNK), runs=runs)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
