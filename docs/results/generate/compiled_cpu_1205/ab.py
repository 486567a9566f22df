"""Interleaved A/B of compiled decode-step variants against the eager engine, in one process.

python docs/results/generate/compiled_cpu_1205/ab.py MODEL B VARIANT [VARIANT ...] OUT.json
MODEL: tiny | small (benchmarks/decode_profile.py's shapes). B prompts of 20 tokens, 40 greedy tokens each
(per_batch.py's workload: every step after the prefill a plain decode of B sequences, max_num_seqs=B).
Each variant gets its own LLM (its own copy of `_forward`'s code object, so the graph caches and dynamo's
recompile limit are per variant); its first generate() compiles (compile seconds = the sum of the runner's
`compile_seconds`: each bucket's first step) and its tokens must equal the eager engine's. Then REPEATS rounds,
each round every variant once in turn (order rotated per round): CPU time (process_time) and wall of one
generate(). Variants: eager | c:<experts>[:<opt>...], experts in gathered|dense|grouped (grouped: the model's
eager dispatch between graph pieces), opts: cppwrap, freezing, autotune (options max_autotune, no cudagraphs),
mat (mode max-autotune-no-cudagraphs), alias (the KV caches as views of one tensor, as before
unaliased_caches), pieces (grouped: the dispatch eagerly between graph pieces, not the opaque op), ctxN (context bucket at least N blocks: a bound on recompiles).
"""
import json, os, sys, time, types
import torch

torch.set_num_threads(1)
from moe.config import ModelConfig
from moe.routing.routers import router_config
from moe.model import Transformer
from moe.engine import LLM, SamplingParams
from moe.engine.runner.compiled import CompiledModelRunner

MODELS = {"tiny": dict(d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, n_experts=8, expert_hidden=512),
          "small": dict(d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, n_experts=8, expert_hidden=768)}
name, B, variants, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3:-1], sys.argv[-1]
REPEATS = int(os.environ.get("REPEATS", 3))
torch._dynamo.config.recompile_limit = 64
torch._dynamo.config.cache_size_limit = 64
torch.manual_seed(0)
cfg = ModelConfig(vocab_size=4096, max_seq_len=512, init_std=0.02, router=router_config(top_k=2), **MODELS[name])
m = Transformer(cfg).eval()
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(3, 4096, (20,), generator=g).tolist() for _ in range(B)]
p = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
opts = dict(max_num_seqs=B, collect_routing_stats=False)


def build(v):
    if v == "eager":
        return LLM.from_model(m, None, **opts)
    _, experts, *flags = v.split(":")
    CompiledModelRunner.cpu_max_batch = B
    CompiledModelRunner.unalias_caches = "alias" not in flags
    CompiledModelRunner.opaque_dispatch = "pieces" not in flags
    llm = LLM.from_model(m, None, compile=True, **opts)
    CompiledModelRunner.unalias_caches = CompiledModelRunner.opaque_dispatch = True
    r = llm.runner
    r.gathered_max_batch = B if experts == "gathered" else 0
    r.dense_max_batch = B if experts == "dense" else 0
    options, mode = {}, None
    for f in flags:
        if f == "cppwrap":
            options["cpp_wrapper"] = True
        elif f == "freezing":
            options["freezing"] = True
        elif f == "autotune":
            options["max_autotune"] = True
        elif f == "mat":
            mode = "max-autotune-no-cudagraphs"
        elif f in ("alias", "pieces"):
            pass  # (set above, before the runner is built)
        elif f.startswith("ctx"):
            lo = int(f[3:])
            r.context_buckets = [c for c in r.context_buckets if c >= lo] or r.context_buckets[-1:]
        else:
            raise SystemExit(f"unknown flag {f}")
    fresh = types.FunctionType(CompiledModelRunner._forward.__code__.replace(), CompiledModelRunner._forward.__globals__)
    kw = {"options": options} if options else {"mode": mode or "default"}
    r._compiled = torch.compile(types.MethodType(fresh, r), dynamic=False, **kw)
    return llm


def run(llm):
    llm.reset_prefix_cache()
    c, w = time.process_time(), time.perf_counter()
    outs = llm.generate(prompts, p)
    return time.process_time() - c, time.perf_counter() - w, [o.token_ids for o in outs]


res = {"model": name, "B": B, "repeats": REPEATS, "torch": torch.__version__, "load_start": open("/proc/loadavg").read().split()[:3],
       "time_start": time.strftime("%H:%M:%S", time.gmtime()), "variants": {}}
llms, ref = {}, None
for v in variants:
    t0 = time.perf_counter()
    llms[v] = build(v)
    cpu, wall, toks = run(llms[v])  # first generate: compiles
    r = llms[v].runner
    comp = getattr(r, "compile_seconds", {})
    if ref is None:
        ref = toks
    res["variants"][v] = {"first_generate_wall": round(wall, 3), "compile_seconds": {str(k): round(s, 2) for k, s in comp.items()},
                          "compile_total": round(sum(comp.values()), 2), "same_tokens_as_first": toks == ref,
                          "cpu": [], "wall": []}
    print(v, "first", round(wall, 2), "compile", res["variants"][v]["compile_seconds"], "same", toks == ref, flush=True)
for rep in range(REPEATS):
    order = variants[rep % len(variants):] + variants[:rep % len(variants)]
    for v in order:
        cpu, wall, toks = run(llms[v])
        assert toks == ref, v
        res["variants"][v]["cpu"].append(round(cpu, 4)); res["variants"][v]["wall"].append(round(wall, 4))
    print(rep, {v: res["variants"][v]["cpu"][-1] for v in variants}, flush=True)
med = lambda xs: sorted(xs)[len(xs) // 2]
base = res["variants"][variants[0]]
for v, d in res["variants"].items():
    d["cpu_median"], d["wall_median"] = med(d["cpu"]), med(d["wall"])
    # ratio of the first variant (the baseline, eager) to this one per round: > 1 means this one is faster
    rc = [b / x for b, x in zip(base["cpu"], d["cpu"])]
    rw = [b / x for b, x in zip(base["wall"], d["wall"])]
    d["speedup_cpu"] = [round(med(rc), 3), round(min(rc), 3), round(max(rc), 3)]
    d["speedup_wall"] = [round(med(rw), 3), round(min(rw), 3), round(max(rw), 3)]
    d["num_compiled_steps"] = getattr(llms[v].runner, "num_compiled_steps", None)
res["load_end"] = open("/proc/loadavg").read().split()[:3]
res["time_end"] = time.strftime("%H:%M:%S", time.gmtime())
json.dump(res, open(out_path, "w"), indent=1)
for v, d in res["variants"].items():
    print(f"{v:28s} cpu {d['cpu_median']:.3f} ({min(d['cpu']):.3f}-{max(d['cpu']):.3f}) vs eager cpu {d['speedup_cpu']} wall {d['speedup_wall']} compile {d['compile_total']}s")
