"""torch.profiler of decode at batch B (argv[2]) on MODEL (argv[1]): one generate() (B prompts of 20 tokens, 40
greedy tokens) of the eager engine and of each compiled variant (argv[3:], ab.py's names), after a warm-up
generate; inductor kernels named (options cpp.enable_kernel_profile, this script only). Prints the top ops by
self CPU time per variant, the time in extern matmuls vs inductor's generated kernels, per decode step."""
import sys, types, torch
from torch.profiler import profile, ProfilerActivity
sys.argv, rest = sys.argv[:4], sys.argv[4:]
import importlib.util, os
here = os.path.dirname(os.path.abspath(__file__))
name, B = sys.argv[1], int(sys.argv[2])
variants = [sys.argv[3]] + rest
# reuse ab.py's model, prompts and build() without running its measurement
src = open(os.path.join(here, "ab.py")).read().split("res = {")[0]
ns = {"__name__": "ab"}
sys.argv = ["ab.py", name, str(B)] + variants + ["/dev/null"]
exec(compile(src, "ab.py", "exec"), ns)
from moe.engine.runner.compiled import CompiledModelRunner
for v in variants:
    llm = ns["build"](v)
    if v != "eager":
        r = llm.runner
        fresh = types.FunctionType(CompiledModelRunner._forward.__code__.replace(), CompiledModelRunner._forward.__globals__)
        opt = {"cpp.enable_kernel_profile": True}
        if "cppwrap" in v: opt["cpp_wrapper"] = True
        if "freezing" in v: opt["freezing"] = True
        r._compiled = torch.compile(types.MethodType(fresh, r), dynamic=False, options=opt)
    ns["run"](llm)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ns["run"](llm)
    ka = prof.key_averages()
    tot = sum(e.self_cpu_time_total for e in ka)
    steps = 39
    print(f"\n=== {name} B={B} {v}: total self CPU {tot/1e3:.1f} ms per generate, {tot/1e3/steps:.2f} ms per step (incl. prefill share)")
    mm = sum(e.self_cpu_time_total for e in ka if e.key in ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::linear", "mkldnn::_linear_pointwise", "mkl::_mkl_linear", "aten::_scaled_dot_product_flash_attention_for_cpu"))
    gen = sum(e.self_cpu_time_total for e in ka if e.key.startswith("graph_") or "cpp_fused" in e.key)
    print(f"extern mm/bmm/linear/sdpa {mm/1e3:.1f} ms; inductor generated kernels {gen/1e3:.1f} ms; rest {(tot-mm-gen)/1e3:.1f} ms")
    for e in sorted(ka, key=lambda e: -e.self_cpu_time_total)[:22]:
        print(f"{e.self_cpu_time_total/1e3:8.2f} ms {e.count:6d}  {e.key[:90]}")
