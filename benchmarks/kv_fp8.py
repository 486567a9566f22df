"""The FP8 KV cache against the full-precision cache on one checkpoint: greedy agreement, the
log-probabilities while the two agree, KV bytes per token and blocks that fit in a fixed budget.

    python -m benchmarks.kv_fp8 --checkpoint runs/x --text corpus.txt --prompts 16 --max-tokens 64

Prompts are consecutive `--prompt-tokens`-token pieces of `--text`. Greedy, eos ignored. The
agreement rate counts, per request, the generated tokens up to and including the first
disagreement (after it the histories differ and nothing more is compared). Exits 1 when the
agreement rate is below `--min-agreement` or the chosen token's log-probability differs by more than
`--max-dlogprob` while the histories agree (a wrong output, not a slow one). Wall clock and CPU time of each run
(one warm-up, then one timed run each) are reported side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from moe import cli  # noqa: E402
from moe.engine import LLM, SamplingParams  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kv_fp8", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--text", required=True, help="text file the prompts are cut from")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--kv-budget-mib", type=float, default=64.0, help="blocks that fit in this much KV memory")
    p.add_argument("--quantization", default=None, help="weight scheme of both runs (default: none)")
    p.add_argument("--min-agreement", type=float, default=0.9)
    p.add_argument("--max-dlogprob", type=float, default=0.5)
    p.add_argument("--json", default=None)
    return p


@cli.guarded
def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    runs, out = {}, {}
    for kv in ("auto", "fp8_e4m3"):
        llm = LLM(a.checkpoint, quantization=a.quantization, device="cpu", dtype="fp32", kv_cache_dtype=kv,
                  kv_cache_memory_bytes=int(a.kv_budget_mib * 2**20), collect_routing_stats=False)
        ids = llm.tokenizer.encode(Path(a.text).read_text(encoding="utf-8")[:200_000])
        L = a.prompt_tokens
        prompts = [ids[i * L:(i + 1) * L] for i in range(a.prompts)]
        sp = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True, logprobs=5)
        llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=2))  # warm-up
        w0, c0 = time.perf_counter(), time.process_time()
        runs[kv] = llm.generate(prompts, sp)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        n = sum(len(o.token_ids) for o in runs[kv])
        out[kv] = {"kv_bytes_per_token": llm.stats()["kv_bytes_per_token"], "blocks_in_budget": llm.num_blocks,
                   "tokens_in_budget": llm.num_blocks * llm.block_size, "wall_s": wall, "cpu_s": cpu,
                   "tokens_per_s": n / wall, "tokens_per_cpu_s": n / cpu}
    agree = compared = 0
    worst = 0.0  # the chosen token's log-probability (what greedy and scoring read)
    worst_top5 = 0.0  # any token in both top-5s (tail tokens move most)
    diffs = []
    for ref, got in zip(runs["auto"], runs["fp8_e4m3"]):
        for i, (x, y) in enumerate(zip(ref.token_ids, got.token_ids)):
            compared += 1
            if x != y:
                break
            agree += 1
            diffs.append(abs(ref.logprobs[i][x] - got.logprobs[i][x]))
            worst = max(worst, diffs[-1])
            common = set(ref.logprobs[i]) & set(got.logprobs[i])
            worst_top5 = max(worst_top5, max(abs(ref.logprobs[i][t] - got.logprobs[i][t]) for t in common))
    res = {"checkpoint": a.checkpoint, "quantization": a.quantization, "prompts": a.prompts,
           "max_tokens": a.max_tokens, "agreement": agree / compared, "agreed_tokens": agree,
           "compared_tokens": compared, "max_abs_dlogprob_chosen": worst,
           "mean_abs_dlogprob_chosen": sum(diffs) / max(1, len(diffs)), "max_abs_dlogprob_top5": worst_top5, "kv_budget_mib": a.kv_budget_mib,
           "runs": out, "blocks_ratio": out["fp8_e4m3"]["blocks_in_budget"] / out["auto"]["blocks_in_budget"]}
    print(json.dumps(res, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    ok = res["agreement"] >= a.min_agreement and worst <= a.max_dlogprob
    if not ok:
        print(f"FAIL: agreement {res['agreement']:.3f} (min {a.min_agreement}) or max |dlogprob| {worst:.4f} "
              f"(max {a.max_dlogprob})", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
