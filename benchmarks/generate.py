"""Throughput of the engine vs HF transformers' `generate()` on the same model, greedy.

    python benchmarks/generate.py                       # random model, 64 prompts, CPU
    python benchmarks/generate.py --checkpoint runs/x   # a trained checkpoint
    python benchmarks/generate.py --device cuda --dtype bf16
    python -m benchmarks.generate --checkpoint runs/x --speculative ngram,draft,self --draft-checkpoint runs/small --compile

The workload is `--num-prompts` prompts of random lengths, each with its own number of output
tokens (drawn in [--min-out, --max-out]; eos ignored so every request runs its full length).
HF runs it two ways: `sequential` (one `generate()` per prompt: the only way HF honours a
per-request length) and `batched` (one left-padded `generate()` of all prompts up to the
longest length, counting only the tokens each request asked for; `--hf-batch-sizes 8 0` adds
static batches of 8, each run to its own longest length, beside the single batch).
`--max-num-seqs 1` makes the engine decode at batch 1, as HF sequential does. Outputs are checked token
for token against the engine's, and any mismatch makes the run exit with status 1. Every side
(engine, HF sequential, HF batched) runs `--repeats` timed runs after one warm-up and reports the
median wall clock and the median process CPU time; ratios are given by both measures (the JSON's
`runs` keeps every timed run of every side, for the spread).
`--compile` adds the engine with compiled decode steps (`LLM(compile=True)`; its warm-up is one
full run, which compiles every batch bucket). `--speculative` adds the comparison of
speculative decoding (benchmarks/generate_spec.py): at batch 1, or with `--spec-batch N` requests in flight.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import generate_spec  # noqa: E402
from moe import cli  # noqa: E402
from moe.config import ModelConfig  # noqa: E402
from moe.routing.routers import router_config  # noqa: E402
from moe.engine import LLM, SamplingParams  # noqa: E402
from moe.loading import load_model  # noqa: E402
from moe.model import Transformer  # noqa: E402


def build_model(args):
    """(the model, its tokenizer or None)."""
    if args.checkpoint:
        model, tok, _cfg = load_model(args.checkpoint, device=args.device, dtype=args.torch_dtype)
        return model, tok
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                      n_kv_heads=args.n_kv_heads, n_experts=args.n_experts, expert_hidden=args.expert_hidden,
                      max_seq_len=512, init_std=args.init_std, router=router_config(top_k=args.top_k))
    return Transformer(cfg).to(args.device, args.torch_dtype).eval(), None


def workload(args, vocab: int):
    g = torch.Generator().manual_seed(args.seed)
    prompts, lens = [], []
    for _ in range(args.num_prompts):
        n = int(torch.randint(args.min_prompt, args.max_prompt + 1, (1,), generator=g))
        prompts.append(torch.randint(3, vocab, (n,), generator=g).tolist())
        lens.append(int(torch.randint(args.min_out, args.max_out + 1, (1,), generator=g)))
    return prompts, lens


def run_engine(model, prompts, lens, args, compile: bool = False, runs: Optional[list] = None):
    llm = LLM.from_model(model, None, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens,
                         attention_backend=args.backend, collect_routing_stats=False, compile=compile)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens]
    if compile:
        llm.generate(prompts, params)  # warm-up: compiles every batch bucket the workload reaches
    else:
        llm.generate(prompts[:4], params[:4])  # warm-up

    def once():
        llm.reset_prefix_cache()  # the same prompts again must not be served from the cache
        llm.reset_stats()
        return llm.generate(prompts, params)

    # the compiled runner's first step per (batch, context) bucket, in the warm-up: its compile time
    compile_s = {f"{b}x{w}": round(t, 3) for (b, w), t in getattr(llm.runner, "compile_seconds", {}).items()}
    outs, wall, cpu = timed(once, args.repeats, runs)
    return [o.token_ids for o in outs], wall, cpu, dict(llm.stats(), compile_seconds=compile_s)


def timed(fn, repeats: int, runs: Optional[list] = None):
    """(the last result, median wall seconds, median process CPU seconds) of `repeats` calls: the
    one policy every side of the comparison is measured with."""
    walls, cpus, out = [], [], None
    for _ in range(max(1, repeats)):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    if runs is not None:
        runs.extend(dict(wall_s=w, cpu_s=c) for w, c in zip(walls, cpus))
    return out, statistics.median(walls), statistics.median(cpus)


@torch.inference_mode()
def run_hf_sequential(hf, prompts, lens, device, repeats: int = 1, runs: Optional[list] = None):
    hf.generate(torch.tensor([prompts[0]], device=device), max_new_tokens=2, do_sample=False)  # warm-up

    def once():
        outs = []
        for p, n in zip(prompts, lens):
            ids = torch.tensor([p], device=device)
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False)
            outs.append(out[0, len(p):].tolist())
        return outs

    return timed(once, repeats, runs)


@torch.inference_mode()
def run_hf_batched(hf, prompts, lens, device, repeats: int = 1, pad_id: int = 0, batch_size: int = 0,
                   runs: Optional[list] = None):
    """HF `generate()` over static left-padded batches of `batch_size` prompts (0: all in one), each
    running to its longest requested output (only the requested tokens count)."""
    size = batch_size or len(prompts)
    batches = []
    for lo in range(0, len(prompts), size):
        chunk = prompts[lo:lo + size]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(chunk):  # left padding
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        batches.append((ids.to(device), mask.to(device), max(lens[lo:lo + size])))
    ids, mask, _ = batches[0]
    hf.generate(ids[:4], attention_mask=mask[:4], max_new_tokens=2, do_sample=False)  # warm-up, as the others

    def once():
        return [hf.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False)
                for ids, mask, n in batches]

    outs, wall, cpu = timed(once, repeats, runs)
    rows = [(out, ids.shape[1], i) for out, (ids, _, _) in zip(outs, batches) for i in range(ids.shape[0])]
    return [out[i, width:width + n].tolist() for (out, width, i), n in zip(rows, lens)], wall, cpu


def compare(name, ref, got, lens):
    same = sum(a == b for a, b in zip(ref, got))
    first_diff = [next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(ref, got)]
    diverged = [(i, j) for i, j in enumerate(first_diff) if j is not None]
    print(f"  {name}: {same}/{len(ref)} outputs identical to the engine's"
          + (f"; first divergences (prompt, token): {diverged[:5]}" if diverged else ""))
    return same


@cli.guarded
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--min-prompt", type=int, default=8)
    ap.add_argument("--max-prompt", type=int, default=64)
    ap.add_argument("--min-out", type=int, default=16)
    ap.add_argument("--max-out", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-batched-tokens", type=int, default=2048)
    ap.add_argument("--hf", default="both", choices=["sequential", "batched", "both", "none"])
    ap.add_argument("--hf-batch-sizes", type=int, nargs="+", default=[0],
                    help="HF batched: static left-padded batches of these sizes, each a side of its own (0: all "
                    "prompts in one batch, the side named hf_batched; n: hf_batched_<n>)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of every side (engine, HF sequential, "
                    "HF batched), after one warm-up each; the median is reported")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--compile", action="store_true", help="also run the engine with compiled decode steps")
    generate_spec.add_arguments(ap)
    # the random model (ignored with --checkpoint)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--n-heads", type=int, default=8)
    ap.add_argument("--n-kv-heads", type=int, default=4)
    ap.add_argument("--n-experts", type=int, default=8)
    ap.add_argument("--expert-hidden", type=int, default=512)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--init-std", type=float, default=0.02)
    args = ap.parse_args(argv)
    args.torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = build_model(args)
    prompts, lens = workload(args, model.cfg.vocab_size)
    n_out = sum(lens)
    print(f"model: {model.num_params() / 1e6:.1f}M params ({model.num_params(active=True) / 1e6:.1f}M active), "
          f"{args.device} {args.dtype}, {torch.get_num_threads()} threads")
    print(f"workload: {len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
          f"{min(lens)}-{max(lens)} output tokens each ({n_out} in all)")

    runs: dict[str, list] = {}  # every timed run of every side: {"wall_s", "cpu_s"} (the spread of the medians)
    eng_out, eng_wall, eng_cpu, stats = run_engine(model, prompts, lens, args, runs=runs.setdefault("engine", []))
    res = {"output_tokens": n_out, "repeats": args.repeats, "params": model.num_params(),
           "active_params": model.num_params(active=True), "dtype": args.dtype, "max_num_seqs": args.max_num_seqs, "engine_tok_s": n_out / eng_wall, "engine_s": eng_wall,
           "engine_cpu_s": eng_cpu, "engine_steps": stats["num_steps"]}
    print(f"timing: median of {args.repeats} timed run(s) per side after one warm-up; wall clock and process CPU time")
    print(f"engine: {eng_wall:.2f}s wall / {eng_cpu:.2f}s CPU, {n_out / eng_wall:,.0f} output tok/s "
          f"({stats['num_steps']} steps)")
    mismatches = 0
    engines = [("engine", eng_wall, eng_cpu)]
    if args.compile:
        out, wall, cpu, cstats = run_engine(model, prompts, lens, args, compile=True,
                                       runs=runs.setdefault("compiled_engine", []))
        same = compare("engine, compiled decode", out, eng_out, lens)
        mismatches += len(out) - same
        engines.append(("compiled engine", wall, cpu))
        res.update(compiled_tok_s=n_out / wall, compiled_s=wall, compiled_cpu_s=cpu, compiled_identical=same,
                   compiled_first_step_s=cstats["compile_seconds"])
        print(f"  compiled decode: {len(cstats['compile_seconds'])} graphs (batch x context blocks), first steps "
              f"{sum(cstats['compile_seconds'].values()):.1f}s in all (compile time)")
        print(f"engine, compiled decode: {wall:.2f}s wall / {cpu:.2f}s CPU, {n_out / wall:,.0f} output tok/s -> "
              f"{eng_wall / wall:.2f}x the eager engine by wall clock, {eng_cpu / cpu:.2f}x by CPU time")

    def make_hf(m):
        try:
            from moe.hf.convert import to_hf_model  # lazy: transformers (the `hf` extra) only for the HF peer
        except ImportError as e:
            print(f"HF comparison skipped: moe.hf.to_hf_model is not available ({e})")
            return None
        hf = to_hf_model(m, pad_token_id=0)
        hf.generation_config.pad_token_id = 0
        hf.generation_config.eos_token_id = None
        return hf

    hf = make_hf(model) if args.hf != "none" else None
    if hf is not None:
        peers = []
        if args.hf in ("sequential", "both"):
            peers.append(("hf_sequential", "HF generate, one prompt at a time", run_hf_sequential))
        if args.hf in ("batched", "both"):
            for size in args.hf_batch_sizes:
                if size:
                    peers.append((f"hf_batched_{size}", f"HF generate, static padded batches of {size}",
                                  functools.partial(run_hf_batched, batch_size=size)))
                else:
                    peers.append(("hf_batched", "HF generate, all prompts in one padded batch", run_hf_batched))
        for key, label, fn in peers:
            out, wall, cpu = fn(hf, prompts, lens, args.device, args.repeats, runs=runs.setdefault(key, []))
            same = compare(label, out, eng_out, lens)
            mismatches += len(out) - same
            res.update({f"{key}_tok_s": n_out / wall, f"{key}_s": wall, f"{key}_cpu_s": cpu, f"{key}_identical": same})
            print(f"{label}: {wall:.2f}s wall / {cpu:.2f}s CPU, {n_out / wall:,.0f} useful tok/s")
            for name, e_wall, e_cpu in engines:
                res[f"{name.replace(' ', '_')}_vs_{key}_wall"] = wall / e_wall
                res[f"{name.replace(' ', '_')}_vs_{key}_cpu"] = cpu / e_cpu
                print(f"  -> {name} is {wall / e_wall:.2f}x faster by wall clock, {cpu / e_cpu:.2f}x by CPU time")
    if args.speculative:
        # `--hf none`: no HF peers in the speculative part either (an MTP model has no HF export)
        spec_res, bad = generate_spec.run(args, model, tokenizer, timed, make_hf if args.hf != "none" else lambda m: None)
        res["speculative"] = spec_res
        mismatches += bad
    res["runs"] = runs
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    if mismatches:
        print(f"FAILED: {mismatches} output(s) differ from the engine's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
