"""How close the decode step is to the cost of reading its weights: the eager and the compiled step
against the step's matmuls alone, same model, same routing, same threads.

    python -m benchmarks.decode_floor --models tiny small --batches 1 8 --json out.json

A decode step of B tokens must read every weight its tokens use: each layer's dense projections
(attention, router, any dense or shared FFN), the experts its tokens were routed to (each once,
however many of the B tokens chose it) and the LM head. At these batch sizes the CPU's GEMMs are
bound by those bytes, not by arithmetic, so the step's **matmul floor**, those same GEMMs on the same
weights with nothing between them (`F.linear` per weight on as many rows as the step gives it; the
experts those of a real decode step, taken from the eager engine's routers), is a lower bound on
any step that keeps the weights as they are (fp32, unpacked). The **stream floor** reads the same
bytes once with a reduction (`torch.sum`), the machine's read bandwidth on them. So
`eager step / matmul floor` is the most a compiled step could gain over the eager one without
fewer weight bytes (quantized or 16-bit weights) or more bandwidth (threads): where it is under
1.3, issue 32's "compiled >= 1.3x eager" cannot be met by removing overhead alone.

Per round (`--repeats`, default 3) every arm runs once, in turn: `--steps` decode steps of the
eager engine and of the compiled one (`LLM(compile=True)`, its buckets compiled in a warm-up
generate beforehand), each step timed (wall clock and process CPU time, median over the steps),
then the floors (median of `--steps` passes). Reported: each arm's median (min-max) over rounds,
and the ratios per round. The two engines' greedy tokens are compared: any difference exits 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks.decode_profile import MODELS
from benchmarks.timing import finish_record, median_seconds
from moe.config import ModelConfig
from moe.engine import LLM, SamplingParams
from moe.model import Transformer
from moe.routing.routers import router_config


def decode_step_times(llm: LLM, prompts: list, steps: int, warmup: int) -> tuple[float, float, list]:
    """Median wall and CPU seconds of `steps` decode steps of all of `prompts` together (after their
    prefill and `warmup` steps), and the tokens each prompt generated."""
    params = SamplingParams(temperature=0, max_tokens=1 + warmup + steps, ignore_eos=True)
    rids = [llm.add_request(p, params) for p in prompts]
    for _ in range(1 + warmup):  # the prefill (one step: every prompt fits the token budget), then warm-up
        llm.step()
    wall, cpu, done = [], [], {}
    for _ in range(steps):
        t, c = time.perf_counter(), time.process_time()
        outs = llm.step()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        done.update({o.request_id: o.output.token_ids for o in outs if o.finished})
    while llm.has_unfinished_requests():
        done.update({o.request_id: o.output.token_ids for o in llm.step() if o.finished})
    return statistics.median(wall), statistics.median(cpu), [done[r] for r in rids]


def routed_experts(llm: LLM, prompts: list) -> list[torch.Tensor]:
    """Each MoE layer's `experts_TK` in one eager decode step of all `prompts` (a router forward hook)."""
    seen: list[torch.Tensor] = []
    hooks = [b.ffn.router.register_forward_hook(lambda m, a, out: seen.append(out.experts_TK.clone()))
             for b in llm.model.layers if b.is_moe]
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    for p in prompts:
        llm.add_request(p, params)
    llm.step()  # the prefill
    seen.clear()
    llm.step()  # one decode step
    for h in hooks:
        h.remove()
    while llm.has_unfinished_requests():
        llm.step()
    return seen


def step_matmuls(model: Transformer, routes: list[torch.Tensor], B: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input rows, weight) of every GEMM a decode step of B tokens must do, in the model's order: each
    block's 2-D linear weights but its routed experts', then the experts `routes` chose, each on the
    rows routed to it (gate/up, then down); the LM head last."""
    pairs, moe_layer = [], 0
    for block in model.layers:
        routed = getattr(block.ffn, "experts", None) if block.is_moe else None
        skip = set(routed.parameters()) if routed is not None else set()
        for mod in block.modules():  # (2-D weights: the linears and the router; norms' are 1-D)
            w = getattr(mod, "weight", None)
            if isinstance(w, torch.Tensor) and w.dim() == 2 and w not in skip:
                pairs.append((torch.randn(B, w.shape[1]), w.detach()))
        if routed is not None:
            counts = torch.bincount(routes[moe_layer].reshape(-1), minlength=routed.gate_up_proj.shape[0])
            moe_layer += 1
            for e in counts.nonzero().flatten().tolist():
                gu, dn = routed.gate_up_proj[e].detach(), routed.down_proj[e].detach()
                n = int(counts[e])
                pairs += [(torch.randn(n, gu.shape[1]), gu), (torch.randn(n, dn.shape[1]), dn)]
    w = model.lm_head.weight.detach()
    return pairs + [(torch.randn(B, w.shape[1]), w)]


def floors(pairs, passes: int) -> tuple[float, float]:
    """Median seconds of one pass of every GEMM in `pairs` (the matmul floor) and of one read of every
    weight (`sum`: the stream floor), each after one untimed pass (the benchmarks' one timer)."""
    cpu = torch.device("cpu")
    return (median_seconds(lambda: [F.linear(x, w) for x, w in pairs], cpu, 1, passes),
            median_seconds(lambda: [w.sum() for _, w in pairs], cpu, 1, passes))


def spread(xs: list[float], nd: int = 3) -> dict:
    return {"median": round(statistics.median(xs), nd), "min": round(min(xs), nd), "max": round(max(xs), nd),
            "all": [round(x, nd) for x in xs]}


def measure(name: str, B: int, args) -> tuple[dict, int]:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=args.vocab, max_seq_len=512, init_std=0.02, router=router_config(top_k=2),
                      **MODELS[name])
    model = Transformer(cfg).eval()
    g = torch.Generator().manual_seed(B)
    prompts = torch.randint(3, args.vocab, (B, args.prompt_len), generator=g).tolist()
    opts = dict(max_num_seqs=B, max_num_batched_tokens=8192, collect_routing_stats=False)
    eager, compiled = LLM.from_model(model, None, **opts), LLM.from_model(model, None, compile=True, **opts)
    t0 = time.perf_counter()
    compiled.generate(prompts, SamplingParams(temperature=0, max_tokens=2 + args.warmup + args.steps,
                                              ignore_eos=True))  # compiles the buckets the timed steps use
    compile_s = time.perf_counter() - t0
    with torch.inference_mode():
        pairs = step_matmuls(model, routed_experts(eager, prompts), B)
    weight_mb = sum(w.numel() * w.element_size() for _, w in pairs) / 1e6
    arms = {k: [] for k in ("eager_ms", "eager_cpu_ms", "compiled_ms", "compiled_cpu_ms", "matmul_floor_ms",
                            "stream_floor_ms")}
    wrong = 0
    for _ in range(args.repeats):
        for arm, llm in (("eager", eager), ("compiled", compiled)):
            wall, cpu, toks = decode_step_times(llm, prompts, args.steps, args.warmup)
            arms[f"{arm}_ms"].append(wall * 1e3)
            arms[f"{arm}_cpu_ms"].append(cpu * 1e3)
            if arm == "eager":
                ref = toks
            else:
                wrong += sum(a != b for a, b in zip(toks, ref))
        with torch.inference_mode():
            mm, stream = floors(pairs, args.steps)
        arms["matmul_floor_ms"].append(mm * 1e3)
        arms["stream_floor_ms"].append(stream * 1e3)
    per_round = lambda a, b: [x / y for x, y in zip(arms[a], arms[b])]
    row = {"model": name, "batch": B, "weight_mb_per_step": round(weight_mb, 1), "compile_s": round(compile_s, 1),
           **{k: spread(v) for k, v in arms.items()},
           "compiled_over_eager": spread(per_round("eager_ms", "compiled_ms")),
           "compiled_over_eager_cpu": spread(per_round("eager_cpu_ms", "compiled_cpu_ms")),
           "eager_over_matmul_floor": spread(per_round("eager_ms", "matmul_floor_ms")),
           "compiled_over_matmul_floor": spread(per_round("compiled_ms", "matmul_floor_ms")),
           "matmul_floor_gb_s": round(weight_mb / 1e3 / (statistics.median(arms["matmul_floor_ms"]) / 1e3), 2),
           "stream_floor_gb_s": round(weight_mb / 1e3 / (statistics.median(arms["stream_floor_ms"]) / 1e3), 2),
           "wrong_outputs": wrong}
    return row, wrong


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "small"], choices=sorted(MODELS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30, help="timed decode steps a round (and floor passes)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    for field, value in (("--batches", min(args.batches)), ("--steps", args.steps), ("--repeats", args.repeats),
                         ("--prompt-len", args.prompt_len)):
        if value < 1:
            print(f"error: {field} must be >= 1 (got {value})", file=sys.stderr)
            return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    record = {"command": " ".join(["python -m benchmarks.decode_floor", *(argv or sys.argv[1:])]),
              "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
              "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "load_before": os.getloadavg(), "rows": []}
    wrong = []
    print(f"{'model':6} {'B':>3} {'MB':>6} {'eager ms':>9} {'compiled':>9} {'mm floor':>9} {'stream':>7} "
          f"{'comp/eager':>10} {'eager/floor':>11} {'comp/floor':>10}")
    for name in args.models:
        for B in args.batches:
            row, bad = measure(name, B, args)
            record["rows"].append(row)
            if bad:
                wrong.append(f"{name} batch {B}: {bad} compiled output(s) differ from the eager engine's")
            med = lambda k: row[k]["median"]
            print(f"{name:6} {B:3d} {row['weight_mb_per_step']:6.1f} {med('eager_ms'):9.2f} {med('compiled_ms'):9.2f} "
                  f"{med('matmul_floor_ms'):9.2f} {med('stream_floor_ms'):7.2f} {med('compiled_over_eager'):10.3f} "
                  f"{med('eager_over_matmul_floor'):11.3f} {med('compiled_over_matmul_floor'):10.3f}", flush=True)
    return finish_record(record, args.json, wrong)


if __name__ == "__main__":
    sys.exit(main())
