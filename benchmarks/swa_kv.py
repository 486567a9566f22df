"""Sliding-window KV freeing: concurrency and throughput of one fixed cache, freeing on and off.

    PYTHONPATH=$PWD python -m benchmarks.swa_kv --repeats 3 --out docs/results/swa_kv/results.json

A tiny random model whose layers all slide (window 64), 16 requests of 64 prompt + 448 generated
tokens, greedy, in a cache of 64 blocks of 16 tokens (1024 tokens: two such requests at full length).
"on" is the engine as built (moe.engine.memory.block_manager frees what the window passed); "off"
is the same engine with the block manager replaced by one without a window (what the engine did
before: every block kept), so the two differ only in freeing. Per run: the most and the mean
sequences running per step, preemptions, steps, wall and CPU time, generated tokens per second;
the outputs of on and off are asserted equal. The runs alternate on / off (ratios of the same round).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import time

import torch

from moe.config import ModelConfig
from moe.engine import LLM, SamplingParams
from moe.engine.memory.block_manager import BlockManager
from moe.model import Transformer
from moe.routing.routers import router_config
from tests.conftest import with_variants

WINDOW, BLOCK, NUM_BLOCKS, PROMPT, GEN, REQUESTS = 64, 16, 64, 64, 448, 16


def build_model() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=260, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4, expert_hidden=64,
                      max_seq_len=1024, sliding_window=WINDOW)
    return Transformer(with_variants(cfg, router_config(top_k=2))).eval()


def run(model, freeing: bool, prompts) -> dict:
    llm = LLM.from_model(model, None, attention_backend="torch", block_size=BLOCK, num_blocks=NUM_BLOCKS,
                         max_num_seqs=REQUESTS, max_num_batched_tokens=256, collect_routing_stats=False,
                         check_invariants=False)
    if not freeing:  # the same engine keeping every block (the engine before the window freed anything)
        llm.block_manager = llm.scheduler.bm = BlockManager(NUM_BLOCKS, BLOCK, True, None)
        llm.sliding_window = None
    params = SamplingParams(temperature=0, max_tokens=GEN, ignore_eos=True)
    for i, p in enumerate(prompts):
        llm.add_request(p, params, request_id=f"r{i:02d}")
    running, outs = [], {}
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    while llm.has_unfinished_requests():
        for ev in llm.step():
            if ev.finished:
                outs[ev.request_id] = ev.output.token_ids
        running.append(len(llm.scheduler.running))
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    st = llm.stats()
    return dict(freeing=freeing, max_running=max(running), mean_running=statistics.mean(running),
                steps=len(running), preemptions=st["num_preemptions"], wall_s=wall,
                cpu_s=(r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), tokens_per_s=REQUESTS * GEN / wall,
                outputs=[outs[k] for k in sorted(outs)])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = build_model()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, 260, (PROMPT,), generator=g).tolist() for _ in range(REQUESTS)]
    runs = []
    for r in range(args.repeats):
        pair = [run(model, True, prompts), run(model, False, prompts)]
        assert pair[0]["outputs"] == pair[1]["outputs"], "freeing changed the outputs"
        for x in pair:
            x.pop("outputs")
            x.update(repeat=r, loadavg=open("/proc/loadavg").read().split()[:3])
            print(json.dumps(x))
        runs.extend(pair)
    record = dict(command="PYTHONPATH=$PWD python -m benchmarks.swa_kv --repeats %d" % args.repeats,
                  commit=subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
                  machine=dict(cpus=os.cpu_count(), torch_threads=1, uname=" ".join(os.uname())),
                  setup=dict(window=WINDOW, block_size=BLOCK, num_blocks=NUM_BLOCKS, prompt=PROMPT, generated=GEN,
                             requests=REQUESTS, max_num_batched_tokens=256), runs=runs)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
