"""Per-step cost of grammar-constrained decoding: the same batch of prompts, unconstrained and
JSON-schema constrained, through one engine.

    python -m benchmarks.guided_overhead --checkpoint runs/x --batch 32 --max-tokens 64 --threads 1

Prompts are the structured-eval items (eval/data/structured.jsonl, through the chat template),
cycled to `--batch`; the constrained run gives each its schema (free-text strings capped at
`--max-string-length` characters, as `eval.max_string_length` does) and may finish early, so
the figures are per engine step: wall time of `step()`, the model forward's share, and the
guided work (`guided_mask_fill_s`: filling the batch bitmask on the worker thread, overlapping
the forward; `guided_mask_wait_s`: the step waiting for it after the forward; and
`guided_mask_apply_s`: masking the logits). Best of `--repeats` runs of each mode.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from eval.tasks.structured import DATA, cap_strings, prompt_ids
from moe.engine import LLM, SamplingParams
from moe.loading import load_model
from moe.report import markdown_table

MODES = ("unconstrained", "constrained")


def run_once(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> dict:
    llm.reset_stats()
    rids = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
    step_s, pending = 0.0, set(rids)
    while pending:
        t0 = time.perf_counter()
        events = llm.step()
        step_s += time.perf_counter() - t0
        pending -= {e.request_id for e in events if e.finished}
    s = llm.stats()
    n = s["num_steps"]
    out = {"steps": n, "output_tokens": s["generation_tokens"], "step_ms": 1e3 * step_s / n,
           "model_ms": 1e3 * s["model_time_s"] / n}
    for k in ("fill", "wait", "apply"):
        out[f"guided_{k}_ms"] = 1e3 * s.get(f"guided_mask_{k}_s", 0.0) / n
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.guided_overhead", description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="a checkpoint with its tokenizer (prompts are text)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-string-length", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--out", default="outputs/benchmarks/guided_overhead.json")
    ap.add_argument("--allow-long-context", action="store_true",
                    help="run prompts + max_tokens past the model's trained context (the engine warns): the per-step "
                         "cost does not depend on trained positions; e.g. the default 256-position checkpoint")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok, _ = load_model(args.checkpoint)
    items = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    items = [items[i % len(items)] for i in range(args.batch)]
    prompts = [prompt_ids(it, tok, None) for it in items]
    llm = LLM.from_model(model, tok, max_model_len=max(len(p) for p in prompts) + args.max_tokens + 1,
                         max_num_seqs=args.batch, seed=0, collect_routing_stats=False, enable_prefix_caching=False,
                         allow_long_context=args.allow_long_context)
    params = {
        "unconstrained": [SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)] * args.batch,
        "constrained": [SamplingParams(temperature=0, max_tokens=args.max_tokens,
                                       guided={"json": cap_strings(it["schema"], args.max_string_length)})
                        for it in items]}
    run_once(llm, prompts[:2], params["constrained"][:2])  # warm-up: builds the guided machinery, compiles
    runs = {mode: [] for mode in MODES}  # every repeat, the modes interleaved (the record keeps the spread)
    for _ in range(args.repeats):
        for mode in MODES:
            runs[mode].append(run_once(llm, prompts, params[mode]))
    best = {mode: min(rs, key=lambda r: r["step_ms"]) for mode, rs in runs.items()}
    columns = ["mode", "steps", "output_tokens", "step_ms", "model_ms", "guided_fill_ms", "guided_wait_ms",
               "guided_apply_ms"]
    table = markdown_table(columns, [[m] + [best[m][c] for c in columns[1:]] for m in MODES])
    print(f"{args.batch} requests, max_tokens {args.max_tokens}, vocab {llm.vocab_size}, "
          f"threads {torch.get_num_threads()} (per engine step, best of {args.repeats}):\n{table}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(args), "results": best, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
