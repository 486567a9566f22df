"""Throughput of the engine vs HF transformers' `generate()` on the same model, greedy.

    python benchmarks/generate.py                       # random model, 64 prompts, CPU
    python benchmarks/generate.py --checkpoint runs/x   # a trained checkpoint
    python benchmarks/generate.py --device cuda --dtype bf16

The workload is `--num-prompts` prompts of random lengths, each with its own number of output
tokens (drawn in [--min-out, --max-out]; eos ignored so every request runs its full length).
HF runs it two ways: `sequential` (one `generate()` per prompt: the only way HF honours a
per-request length) and `batched` (one left-padded `generate()` of all prompts up to the
longest length, counting only the tokens each request asked for). Outputs are checked token
for token against the engine's; the reported figure is output tokens per second (best of
`--repeats` runs, which matters on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from moe.config import ModelConfig, RouterConfig  # noqa: E402
from moe.engine import LLM, SamplingParams  # noqa: E402
from moe.model import Transformer  # noqa: E402


def build_model(args) -> Transformer:
    if args.checkpoint:
        from moe.checkpoint import load_model
        model, _tok, _cfg = load_model(args.checkpoint, device=args.device, dtype=args.torch_dtype)
        return model
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                      n_kv_heads=args.n_kv_heads, n_experts=args.n_experts, expert_hidden=args.expert_hidden,
                      max_seq_len=512, init_std=args.init_std)
    return Transformer(cfg, RouterConfig(top_k=args.top_k)).to(args.device, args.torch_dtype).eval()


def workload(args, vocab: int):
    g = torch.Generator().manual_seed(args.seed)
    prompts, lens = [], []
    for _ in range(args.num_prompts):
        n = int(torch.randint(args.min_prompt, args.max_prompt + 1, (1,), generator=g))
        prompts.append(torch.randint(3, vocab, (n,), generator=g).tolist())
        lens.append(int(torch.randint(args.min_out, args.max_out + 1, (1,), generator=g)))
    return prompts, lens


def run_engine(model, prompts, lens, args):
    llm = LLM.from_model(model, None, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens,
                         attention_backend=args.backend, collect_routing_stats=False)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens]
    llm.generate(prompts[:4], params[:4])  # warm-up
    best = float("inf")
    for _ in range(args.repeats):
        llm.reset_prefix_cache()  # the same prompts again must not be served from the cache
        llm.reset_stats()
        t = time.perf_counter()
        outs = llm.generate(prompts, params)
        best = min(best, time.perf_counter() - t)
    return [o.token_ids for o in outs], best, llm.stats()


@torch.inference_mode()
def run_hf_sequential(hf, prompts, lens, device):
    hf.generate(torch.tensor([prompts[0]], device=device), max_new_tokens=2, do_sample=False)  # warm-up
    outs = []
    t = time.perf_counter()
    for p, n in zip(prompts, lens):
        ids = torch.tensor([p], device=device)
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False)
        outs.append(out[0, len(p):].tolist())
    return outs, time.perf_counter() - t


@torch.inference_mode()
def run_hf_batched(hf, prompts, lens, device, repeats: int = 1, pad_id: int = 0):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=max(lens), min_new_tokens=max(lens),
                          do_sample=False)
        best = min(best, time.perf_counter() - t)
    return [out[i, width:width + n].tolist() for i, n in enumerate(lens)], best


def compare(name, ref, got, lens):
    same = sum(a == b for a, b in zip(ref, got))
    first_diff = [next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(ref, got)]
    diverged = [(i, j) for i, j in enumerate(first_diff) if j is not None]
    print(f"  {name}: {same}/{len(ref)} outputs identical to the engine's"
          + (f"; first divergences (prompt, token): {diverged[:5]}" if diverged else ""))
    return same


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
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of the engine and of HF batched (best "
                    "kept; HF sequential runs once)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the results here")
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

    model = build_model(args)
    prompts, lens = workload(args, model.cfg.vocab_size)
    n_out = sum(lens)
    print(f"model: {model.num_params() / 1e6:.1f}M params ({model.num_params(active=True) / 1e6:.1f}M active), "
          f"{args.device} {args.dtype}, {torch.get_num_threads()} threads")
    print(f"workload: {len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
          f"{min(lens)}-{max(lens)} output tokens each ({n_out} in all)")

    eng_out, eng_dt, stats = run_engine(model, prompts, lens, args)
    res = {"engine_tok_s": n_out / eng_dt, "engine_s": eng_dt, "output_tokens": n_out, "engine_steps": stats["num_steps"]}
    print(f"engine: {eng_dt:.2f}s, {n_out / eng_dt:,.0f} output tok/s ({stats['num_steps']} steps)")

    if args.hf != "none":
        try:
            from moe.hf import to_hf_model
        except ImportError as e:
            print(f"HF comparison skipped: moe.hf.to_hf_model is not available ({e})")
            return 0
        hf = to_hf_model(model, pad_token_id=0)
        hf.generation_config.pad_token_id = 0
        hf.generation_config.eos_token_id = None
        if args.hf in ("sequential", "both"):
            out, dt = run_hf_sequential(hf, prompts, lens, args.device)
            res.update(hf_sequential_tok_s=n_out / dt, hf_sequential_s=dt,
                       hf_sequential_identical=compare("HF sequential", out, eng_out, lens))
            print(f"HF generate, one prompt at a time: {dt:.2f}s, {n_out / dt:,.0f} tok/s -> engine is "
                  f"{dt / eng_dt:.1f}x faster")
        if args.hf in ("batched", "both"):
            out, dt = run_hf_batched(hf, prompts, lens, args.device, args.repeats)
            res.update(hf_batched_tok_s=n_out / dt, hf_batched_s=dt,
                       hf_batched_identical=compare("HF batched", out, eng_out, lens))
            print(f"HF generate, all prompts in one padded batch: {dt:.2f}s, {n_out / dt:,.0f} useful tok/s -> "
                  f"engine is {dt / eng_dt:.1f}x faster")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
