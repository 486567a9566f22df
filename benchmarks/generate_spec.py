"""The speculative-decoding part of `python -m benchmarks.generate --speculative ngram,draft,self,mtp`.

Batch 1 by default (one request at a time, the case speculation is for), greedy, `ignore_eos`:
the plain engine, then the engine with each method, then HF `generate()` one prompt at a time
with its own peer of each method where it has one (`prompt_lookup_num_tokens` for ngram,
assisted generation with the draft model exported to HF for draft; HF has no self-speculation).
`--spec-batch N` runs every engine side with N requests in flight (`max_num_seqs=N`: all prompts
submitted at once, N decoding together), the plain engine at the same N, and leaves out the HF
peers (they run one prompt at a time: not a peer at batch N). Every output must equal the plain
engine's token for token (else the run exits 1). Prompts are
`--spec-prompts` windows of `--spec-prompt-len` tokens cut from `--corpus` (a text file, or
`pystdlib` for Python standard-library sources), encoded with the checkpoint's tokenizer.
Timing: the same policy as the rest of the benchmark (median of `--repeats` after a warm-up,
wall clock and process CPU time).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from moe.engine import LLM, SamplingParams
from moe.loading import load_model

STDLIB_FILES = ("argparse.py", "json/encoder.py", "textwrap.py", "dataclasses.py", "inspect.py", "logging/__init__.py")


def positive_int(text: str) -> int:
    """argparse type of --spec-batch: an integer >= 1 (argparse names the option and exits 2)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed values are integers >= 1")
    return n


def add_arguments(ap) -> None:
    g = ap.add_argument_group("speculative decoding")
    g.add_argument("--speculative", default=None, help="comma-separated methods: ngram,draft,self,mtp")
    g.add_argument("--spec-batch", type=positive_int, default=1,
                   help="requests in flight (max_num_seqs) of every engine side: 1 (default) or N, where the HF "
                   "peers (one prompt at a time) are left out")
    g.add_argument("--spec-tokens", type=int, default=4, help="k: tokens proposed per step")
    g.add_argument("--draft-checkpoint", default=None, help="the draft model of method 'draft' (same tokenizer)")
    g.add_argument("--self-top-k", type=int, default=1, help="router top_k of the self-drafting pass")
    g.add_argument("--self-skip-layers", default="", help="comma-separated layers the self-drafting pass skips")
    g.add_argument("--corpus", default="pystdlib", help="prompt text: a file, or 'pystdlib'")
    g.add_argument("--spec-prompts", type=int, default=8)
    g.add_argument("--spec-prompt-len", type=int, default=96)
    g.add_argument("--spec-max-tokens", type=int, default=64)


def corpus_prompts(args, tokenizer) -> list[list[int]]:
    if args.corpus == "pystdlib":
        root = Path(__import__("os").__file__).parent
        text = "\n".join((root / f).read_text(encoding="utf-8") for f in STDLIB_FILES)
    else:
        text = Path(args.corpus).read_text(encoding="utf-8")
    ids = tokenizer.encode(text)
    n, L = args.spec_prompts, args.spec_prompt_len
    stride = max(L, (len(ids) - L) // max(1, n))
    return [ids[i * stride:i * stride + L] for i in range(n) if i * stride + L <= len(ids)]


def spec_config(method: str, args) -> dict:
    cfg = {"method": method, "num_tokens": args.spec_tokens}
    if method == "draft":
        if not args.draft_checkpoint:
            raise SystemExit("error: --speculative draft needs --draft-checkpoint")
        cfg["model"] = args.draft_checkpoint
    if method == "self":
        cfg["top_k"] = args.self_top_k
        cfg["skip_layers"] = [int(i) for i in args.self_skip_layers.split(",") if i.strip()]
    return cfg


def run(args, model, tokenizer, timed, make_hf) -> tuple[dict, int]:
    """Returns (results, number of outputs that differ from the plain engine's)."""
    if tokenizer is None:
        raise SystemExit("error: --speculative needs --checkpoint (a trained model and its tokenizer)")
    prompts = corpus_prompts(args, tokenizer)
    n_out = len(prompts) * args.spec_max_tokens
    params = SamplingParams(temperature=0, max_tokens=args.spec_max_tokens, ignore_eos=True)
    batch = args.spec_batch
    if batch > len(prompts):
        print(f"note: --spec-batch {batch} with {len(prompts)} prompts: at most {len(prompts)} run together")
    print(f"\nspeculative decoding, batch {batch}: {len(prompts)} prompts of {args.spec_prompt_len} tokens from "
          f"{args.corpus}, {args.spec_max_tokens} greedy tokens each, k={args.spec_tokens}")
    res, mismatches, base, rows = {"batch": batch}, 0, None, []
    runs: dict[str, list] = {}  # every timed run of every side (the spread of the medians)

    def engine(name, spec):
        llm = LLM.from_model(model, tokenizer, max_num_seqs=batch, collect_routing_stats=False, speculative=spec,
                             compile=args.compile)
        llm.generate(prompts[:batch], params)  # warm-up (and compile) at the measured batch

        def once():
            llm.reset_prefix_cache()
            llm.reset_stats()
            return [o.token_ids for o in llm.generate(prompts, params)]
        out, wall, cpu = timed(once, args.repeats, runs.setdefault(name, []))
        return out, wall, cpu, llm.stats()

    def record(name, out, wall, cpu, extra=""):
        nonlocal mismatches
        same = sum(a == b for a, b in zip(out, base[0])) if base else len(out)
        mismatches += len(out) - same
        vs = f"{base[1] / wall:.2f}x / {base[2] / cpu:.2f}x" if base else "1.00x / 1.00x"
        res[name] = dict(tok_s=n_out / wall, wall_s=wall, cpu_s=cpu, identical=same,
                         vs_plain_wall=base[1] / wall if base else 1.0, vs_plain_cpu=base[2] / cpu if base else 1.0,
                         runs=runs.get(name, []))
        rows.append(f"| {name} | {wall:.2f} | {cpu:.2f} | {n_out / wall:,.0f} | {vs} | {extra} | {same}/{len(out)} |")

    out, wall, cpu, _ = engine("engine, plain", None)
    base = None
    record("engine, plain", out, wall, cpu)
    base = (out, wall, cpu)
    for method in [m.strip() for m in args.speculative.split(",") if m.strip()]:
        name = f"engine, {method}"
        out, wall, cpu, st = engine(name, spec_config(method, args))
        acc = (f"acceptance {st['spec_acceptance_rate']:.2f} (first draft {st['spec_first_acceptance_rate']:.2f}), "
               f"{st['spec_mean_accepted_length']:.2f} accepted/step")
        record(name, out, wall, cpu, acc)
        res[name].update(acceptance_rate=st["spec_acceptance_rate"],
                         first_acceptance_rate=st["spec_first_acceptance_rate"],
                         mean_accepted_length=st["spec_mean_accepted_length"])
    hf = make_hf(model) if batch == 1 else None
    if batch > 1:
        print(f"HF peers left out at batch {batch} (they run one prompt at a time)")
    if hf is not None:
        hf_runs = [("HF generate, plain", {})]
        if "ngram" in args.speculative:
            hf_runs.append(("HF generate, prompt lookup", {"prompt_lookup_num_tokens": args.spec_tokens}))
        if "draft" in args.speculative:
            draft, _tok, _cfg = load_model(args.draft_checkpoint, device=args.device, dtype=args.torch_dtype)
            hf_draft = make_hf(draft)
            hf_draft.generation_config.num_assistant_tokens = args.spec_tokens
            hf_draft.generation_config.num_assistant_tokens_schedule = "constant"
            hf_runs.append(("HF generate, assisted (draft)", {"assistant_model": hf_draft}))
        for name, kw in hf_runs:
            def once(kw=kw):
                with torch.inference_mode():
                    outs = []
                    for p in prompts:
                        ids = torch.tensor([p], device=args.device)
                        o = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.spec_max_tokens,
                                        min_new_tokens=args.spec_max_tokens, do_sample=False, **kw)
                        outs.append(o[0, len(p):].tolist())
                    return outs
            once_warm = prompts[:1]
            with torch.inference_mode():  # warm-up
                hf.generate(torch.tensor([once_warm[0]], device=args.device), max_new_tokens=2, do_sample=False, **kw)
            out, wall, cpu = timed(once, args.repeats, runs.setdefault(name, []))
            record(name, out, wall, cpu)
    print("\n| run | wall s | CPU s | tok/s (wall) | vs plain engine (wall / CPU) | speculation | identical |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    sys.stdout.flush()
    return res, mismatches
