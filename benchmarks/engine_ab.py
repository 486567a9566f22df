"""In-process interleaved A/B of this session's engine changes by CPU time (issue 32, perf_1204c).

    python -m benchmarks.engine_ab --rounds 4 --json out.json

One random model (benchmarks/generate.py's `tiny`), two workloads (`b1`: 6 prompts one at a time,
`--max-num-seqs 1`, as the batch-1 benchmark; `p32`: 32 mixed prompts, continuous batching), and
three engines per workload, each warmed up once, then timed in turn every round by
`time.process_time` (so a loaded machine's other processes do not count; the order rotates each
round):

* `before`: the changes undone in the engine instance: the block manager's previous allocation
  (a first-in first-out free list, no preference for a sequence's next block id), the gathered
  decode's previous bound (fused attention up to 2^18 gathered elements, copy + matmuls above) and
  the previous batch-1 view decode (two matmuls: `benchmarks.decode_attention_ab.view_matmul`);
* `alloc`: only the allocation change (the previous bound and view decode);
* `after`: the code as it is.

Every engine's tokens must equal the `after` engine's (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import types
from collections import deque

import torch

import moe.attention.paged_torch as pt
import moe.attention.paged_torch_decode as ptd
from benchmarks.decode_attention_ab import view_matmul
from benchmarks.generate import build_model, workload
from moe.engine import LLM, SamplingParams

OLD_SDPA_MAX_GATHERED = 1 << 18
WORKLOADS = {"b1": dict(num_prompts=6, max_num_seqs=1), "p32": dict(num_prompts=32, max_num_seqs=64)}


def previous_allocate_slots(self, seq, num_new_tokens: int) -> bool:
    """BlockManager.allocate_slots before this change (commit cee8cfd), for the `before` engine."""
    if self.sliding_window is not None:
        self.release_out_of_window(seq)
    need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
    if need > self.num_free_blocks:
        return False
    for _ in range(need):
        seq.block_table.append(self._take_block())
    return True


def make_engine(model, max_num_seqs: int, old_alloc: bool) -> LLM:
    llm = LLM.from_model(model, None, max_num_seqs=max_num_seqs, max_num_batched_tokens=2048,
                         collect_routing_stats=False)
    if old_alloc:
        bm = llm.block_manager
        assert bm.num_used_blocks == 0 and type(bm).__name__ == "BlockManager", "a fresh single-group manager"
        bm.pool.free_ids = bm.free_ids = deque(bm.free_ids)  # (ascending on a fresh manager, as before)
        bm.allocate_slots = types.MethodType(previous_allocate_slots, bm)
    return llm


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    margs = argparse.Namespace(checkpoint=None, device="cpu", torch_dtype=torch.float32, vocab=4096, d_model=256,
                               n_layers=4, n_heads=8, n_kv_heads=4, n_experts=8, expert_hidden=512, top_k=2,
                               init_std=0.02)
    model, _ = build_model(margs)
    # (previous allocation?, the gathered decode's bound, the batch-1 view decode)
    variants = {"before": (True, OLD_SDPA_MAX_GATHERED, view_matmul),
                "alloc": (False, OLD_SDPA_MAX_GATHERED, view_matmul),
                "after": (False, ptd.SDPA_MAX_GATHERED, pt.decode_contiguous)}
    saved, out, rc = (ptd.SDPA_MAX_GATHERED, pt.decode_contiguous), {}, 0
    try:
        for w in args.workloads:
            spec = WORKLOADS[w]
            wargs = argparse.Namespace(seed=0, num_prompts=spec["num_prompts"], min_prompt=8, max_prompt=64,
                                       min_out=16, max_out=128)
            prompts, lens = workload(wargs, 4096)
            params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens]
            engines = {}
            for name, (old_alloc, bound, view) in variants.items():
                ptd.SDPA_MAX_GATHERED, pt.decode_contiguous = bound, view
                engines[name] = make_engine(model, spec["max_num_seqs"], old_alloc)
                engines[name].generate(prompts[:4], params[:4])  # warm-up, as benchmarks/generate.py
            cpu = {n: [] for n in variants}
            tokens = {}
            names = list(variants)
            for r in range(args.rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    llm = engines[name]
                    ptd.SDPA_MAX_GATHERED, pt.decode_contiguous = variants[name][1:]
                    llm.reset_prefix_cache()
                    t = time.process_time()
                    res = llm.generate(prompts, params)
                    cpu[name].append(time.process_time() - t)
                    tokens[name] = [o.token_ids for o in res]
            same = {n: sum(a == b for a, b in zip(tokens[n], tokens["after"])) for n in names}
            if any(v != len(prompts) for v in same.values()):
                rc = 1
            med = {n: statistics.median(v) for n, v in cpu.items()}
            out[w] = {"cpu_s": cpu, "median_cpu_s": med, "identical_to_after": same, "prompts": len(prompts),
                      "output_tokens": sum(lens), "before_over_after": med["before"] / med["after"],
                      "before_over_alloc": med["before"] / med["alloc"]}
            print(f"{w}: " + ", ".join(f"{n} {med[n]:.3f}s CPU ({min(v):.3f}-{max(v):.3f})" for n, v in cpu.items())
                  + f"; before/after {med['before'] / med['after']:.3f}, before/alloc {med['before'] / med['alloc']:.3f};"
                  f" identical {same}", flush=True)
    finally:
        ptd.SDPA_MAX_GATHERED, pt.decode_contiguous = saved
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": args.rounds, "torch": torch.__version__, "workloads": out}, f, indent=1)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
