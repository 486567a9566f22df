"""Where one decode step's time goes: the engine's step against HF `generate()`'s, same model.

    python -m benchmarks.decode_profile --batches 1 8 64 --json docs/results/decode_profile/tiny.json

For each batch size B, B prompts of `--prompt-len` random tokens are decoded greedily by the
engine and by HF `generate()` (the same random MoE exported to HF Mixtral, as
benchmarks/generate.py builds its peer). Each part of a decode step is timed by a wrapper
around the function that does it (wall clock, `time.perf_counter`); the wrappers also open a
`torch.profiler.record_function` range of the part's name, so the profiled pass (one more run
under torch.profiler) shows them in its trace and its operator summary. The parts:

engine: scheduler (incl. block allocation), speculative hooks, input preparation (of which
block tables), forward (of which attention projections + rotary, paged attention (cache write +
kernel), MoE router, MoE experts (dispatch + expert GEMMs), LM head), sampling (non-finite
check, penalty context, sampler), stop checks + detokenisation, and the Python between them
(step - the parts). HF: prepare_inputs_for_generation, forward (same split), logits
processors, stopping criteria, _update_model_kwargs_for_generation and the rest of its loop.

Times are medians over the timed decode steps (the engine: `--steps` steps after the prefill
step and `--warmup` steps; HF: the decode forwards of one `generate()` of `--warmup + --steps`
new tokens after one warm-up call; HF's parts outside its forward are per loop iteration).
The engine's and HF's greedy tokens are compared; any difference exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.autograd import _profiler_enabled
from torch.profiler import ProfilerActivity, profile, record_function

import moe.engine.core.engine as engine_mod
import moe.engine.runner.model_runner as runner_mod
from moe import cli
from moe.config import ModelConfig
from moe.engine import LLM, SamplingParams
from moe.engine.sequence import Sequence
from moe.model import Transformer
from moe.routing.routers import router_config

MODELS = {  # the two random models of the issue: benchmarks/generate.py's default, configs/model/small.yaml
    "tiny": dict(d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, n_experts=8, expert_hidden=512),
    "small": dict(d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, n_experts=8, expert_hidden=768),
}


class PartTimers:
    """Wall-clock time per named part, summed within a step, one sample per step. `wrap` replaces
    an attribute by a timing wrapper (restored on `restore`); the wrapper counts only while
    `active` (a flag: the HF side turns it on for decode forwards only)."""

    def __init__(self):
        self.current: dict[str, float] = defaultdict(float)
        self.steps: dict[str, list[float]] = defaultdict(list)
        self.active = False
        self._patches: list[tuple[object, str, object, bool]] = []

    def wrap(self, owner, attr: str, part: str, gate=None):
        original = getattr(owner, attr)
        had_own = attr in getattr(owner, "__dict__", {})

        @functools.wraps(original)  # HF validates generate()'s kwargs against forward's signature
        def timed(*args, **kw):
            counting = self.active if gate is None else gate(args, kw)
            if not counting:
                return original(*args, **kw)
            rng = record_function(part) if _profiler_enabled() else contextlib.nullcontext()
            t0 = time.perf_counter()
            with rng:
                out = original(*args, **kw)
            self.current[part] += time.perf_counter() - t0
            return out

        setattr(owner, attr, timed)
        self._patches.append((owner, attr, original, had_own))

    def end_step(self, total_s: float) -> None:
        self.current["step"] = total_s
        for part, t in self.current.items():
            self.steps[part].append(t)
        self.current = defaultdict(float)

    def restore(self) -> None:
        for owner, attr, original, had_own in reversed(self._patches):
            if had_own:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)
        self._patches.clear()

    def medians_us(self) -> dict[str, float]:
        n = len(self.steps["step"])
        return {p: round(1e6 * statistics.median(v + [0.0] * (n - len(v))), 1) for p, v in self.steps.items()}


def _wrap_model_parts(t: PartTimers, layers, attn_name: str, ffn_name: str, lm_head, gate=None) -> None:
    for layer in layers:
        t.wrap(getattr(layer, attn_name), "forward", "forward/attention", gate)
        ffn = getattr(layer, ffn_name)
        t.wrap(ffn, "forward", "forward/moe", gate)
        t.wrap(getattr(ffn, "router", None) or ffn.gate, "forward", "forward/moe/router", gate)
        t.wrap(ffn.experts, "forward", "forward/moe/experts", gate)
    t.wrap(lm_head, "forward", "forward/lm_head", gate)


def instrument_engine(llm: LLM) -> PartTimers:
    t = PartTimers()
    t.wrap(llm.scheduler, "schedule", "scheduler")
    for hook in ("propose", "take_back", "observe"):
        t.wrap(llm.spec, hook, "speculative_hooks")
    t.wrap(llm.runner, "prepare", "input_preparation")
    if hasattr(runner_mod, "padded_tables"):
        t.wrap(runner_mod, "padded_tables", "input_preparation/block_tables")
    t.wrap(llm.model, "forward", "forward")
    _wrap_model_parts(t, llm.model.layers, "attn", "ffn", llm.model.lm_head)
    t.wrap(llm.runner.context, "attend", "forward/attention/paged")
    t.wrap(llm, "_sample", "sampling")
    t.wrap(llm.sampler, "sample", "sampling/sampler")
    t.wrap(engine_mod, "append_token", "stop_checks_detok")
    t.wrap(Sequence, "detokenize", "stop_checks_detok/detokenize")
    return t


def run_engine(model, prompts, steps: int, warmup: int, profiled: bool):
    llm = LLM.from_model(model, None, max_num_seqs=len(prompts), max_num_batched_tokens=8192,
                         collect_routing_stats=False)
    params = SamplingParams(temperature=0, max_tokens=1 + warmup + steps, ignore_eos=True)
    rids = [llm.add_request(p, params) for p in prompts]
    llm.step()  # the prefill (every prompt fits the token budget)
    for _ in range(warmup):
        llm.step()
    t = instrument_engine(llm)
    prof = profile(activities=[ProfilerActivity.CPU]) if profiled else contextlib.nullcontext()
    try:
        with prof:
            for _ in range(steps):
                t.active = True
                t0 = time.perf_counter()
                llm.step()
                t.end_step(time.perf_counter() - t0)
                t.active = False
    finally:
        t.restore()
    while llm.has_unfinished_requests():
        llm.step()
    outs = [llm.requests.get(r) for r in rids]
    assert not any(outs), "every request finished"
    return t, prof if profiled else None


def engine_tokens(model, prompts, n_new: int) -> list[list[int]]:
    llm = LLM.from_model(model, None, max_num_seqs=len(prompts), max_num_batched_tokens=8192,
                         collect_routing_stats=False)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n_new, ignore_eos=True))
    return [o.token_ids for o in outs]


@torch.inference_mode()
def run_hf(hf, prompts, steps: int, warmup: int, profiled: bool):
    from transformers.generation.logits_process import LogitsProcessorList
    from transformers.generation.stopping_criteria import StoppingCriteriaList

    ids = torch.tensor(prompts)
    n_new = 1 + warmup + steps
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False)
    hf.generate(ids, **kw)  # warm-up
    t = PartTimers()
    state = dict(decoding=False)  # whether the forward now running is a decode step's (one new token a row)

    def outer_gate(args, kw):  # the outermost forward wrapper: it sees the call first and records its kind
        ids_BT = kw.get("input_ids", args[0] if args else None)
        state["decoding"] = ids_BT is not None and ids_BT.shape[1] == 1
        return t.active and not state["decoding"]

    def in_decode(_args, _kw):
        return t.active and state["decoding"]

    _wrap_model_parts(t, hf.model.layers, "self_attn", "mlp", hf.lm_head, gate=in_decode)
    t.wrap(hf, "forward", "forward", gate=in_decode)
    t.wrap(hf, "forward", "prefill_forward", gate=outer_gate)
    t.wrap(hf, "prepare_inputs_for_generation", "prepare_inputs")
    t.wrap(hf, "_update_model_kwargs_for_generation", "update_model_kwargs")
    t.wrap(LogitsProcessorList, "__call__", "logits_processors")
    t.wrap(StoppingCriteriaList, "__call__", "stopping_criteria")
    prof = profile(activities=[ProfilerActivity.CPU]) if profiled else contextlib.nullcontext()
    try:
        t.active = True
        with prof:
            t0 = time.perf_counter()
            out = hf.generate(ids, **kw)
            wall = time.perf_counter() - t0
    finally:
        t.active = False
        t.restore()
    # per decode step: the decode forwards' parts are summed over the run, spread over its decode steps; the
    # loop's other parts run once per new token (the prefill's iteration too), so they are spread over n_new
    n_steps = n_new - 1
    totals = dict(t.current)
    prefill_s = totals.pop("prefill_forward", 0.0)
    per_step = {p: round(1e6 * s / (n_steps if p.startswith("forward") else n_new), 1) for p, s in totals.items()}
    per_step["step"] = round(1e6 * (wall - prefill_s) / n_steps, 1)
    return per_step, out[:, ids.shape[1]:].tolist(), prof if profiled else None


def with_overhead(parts: dict[str, float], top_level: list[str]) -> dict[str, float]:
    """`parts` plus `python_between_parts`: the step minus its top-level parts."""
    out = dict(parts)
    out["python_between_parts"] = round(parts["step"] - sum(parts.get(p, 0.0) for p in top_level), 1)
    return out


ENGINE_TOP = ["scheduler", "speculative_hooks", "input_preparation", "forward", "sampling", "stop_checks_detok"]
HF_TOP = ["prepare_inputs", "forward", "logits_processors", "stopping_criteria", "update_model_kwargs"]


def trace_summary(prof, rows: int = 25) -> list[dict]:
    """The profiled pass's top operators and ranges by self CPU time."""
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    return [dict(name=e.key, calls=e.count, self_cpu_us=round(e.self_cpu_time_total, 1),
                 cpu_us=round(e.cpu_time_total, 1)) for e in events]


def print_table(batch: int, eng: dict, hf: dict) -> None:
    print(f"\nbatch {batch}: per decode step, median, microseconds")
    print(f"  {'part':40s} {'engine':>10s} {'HF':>10s}")
    for p in sorted(set(eng) | set(hf), key=lambda p: (p != "step", p)):
        e, h = eng.get(p), hf.get(p)
        print(f"  {p:40s} {'' if e is None else f'{e:10.0f}'} {'' if h is None else f'{h:10.0f}'}")


@cli.guarded
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", choices=sorted(MODELS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32, help="timed decode steps")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-profile", action="store_true", help="skip the torch.profiler pass")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=args.vocab, max_seq_len=512, init_std=0.02, router=router_config(top_k=2),
                      **MODELS[args.model])
    model = Transformer(cfg).eval()
    from moe.hf.convert import to_hf_model  # lazy: transformers only here
    hf = to_hf_model(model, pad_token_id=0)
    hf.generation_config.pad_token_id = 0
    hf.generation_config.eos_token_id = None
    g = torch.Generator().manual_seed(0)
    res = dict(model=args.model, params_m=round(model.num_params() / 1e6, 2),
               active_params_m=round(model.num_params(active=True) / 1e6, 2), prompt_len=args.prompt_len,
               steps=args.steps, warmup=args.warmup, threads=torch.get_num_threads(), batches={})
    bad = 0
    for B in args.batches:
        prompts = torch.randint(3, args.vocab, (B, args.prompt_len), generator=g).tolist()
        eng_t, _ = run_engine(model, prompts, args.steps, args.warmup, profiled=False)
        hf_parts, hf_tokens, _ = run_hf(hf, prompts, args.steps, args.warmup, profiled=False)
        eng = with_overhead(eng_t.medians_us(), ENGINE_TOP)
        hf_parts = with_overhead(hf_parts, HF_TOP)
        ref = engine_tokens(model, prompts, 1 + args.warmup + args.steps)
        same = sum(a == b for a, b in zip(ref, hf_tokens))
        bad += B - same
        entry = dict(engine_us=eng, hf_us=hf_parts, hf_over_engine_step=round(hf_parts["step"] / eng["step"], 3),
                     identical_outputs=same)
        if not args.no_profile:
            _, eng_prof = run_engine(model, prompts, args.steps, args.warmup, profiled=True)
            _, _, hf_prof = run_hf(hf, prompts, args.steps, args.warmup, profiled=True)
            entry["engine_trace_top"] = trace_summary(eng_prof)
            entry["hf_trace_top"] = trace_summary(hf_prof)
        res["batches"][str(B)] = entry
        print_table(B, eng, hf_parts)
        print(f"  HF step / engine step = {entry['hf_over_engine_step']:.2f}; {same}/{B} outputs identical")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=2))
    if bad:
        print(f"FAILED: {bad} output(s) of HF differ from the engine's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
