"""The engine's `finite_rows` as the first torch calls after a decode step's forward: each of its calls timed
(and `torch.empty(1)` before them), then the whole function called again at once (`second call`). COMP=1: the
compiled `small` engine at batch 1, COMP=0: the eager one. Run at 39e3c65 (the old `finite_rows`), from the
repository root: COMP=1 OMP_NUM_THREADS=1 PYTHONPATH=$PWD python <this file>"""
import sys, time, torch, statistics, types
sys.argv = [sys.argv[0]]
import benchmarks.generate as G
from moe.engine import LLM, SamplingParams
import moe.engine.core.engine as EN
torch.set_num_threads(1)
class A: pass
a = A(); a.checkpoint=None; a.vocab=4096; a.d_model=512; a.n_layers=8; a.n_heads=8; a.n_kv_heads=4; a.n_experts=8
a.expert_hidden=768; a.init_std=0.02; a.top_k=2; a.device='cpu'; a.torch_dtype=torch.float32
m, _ = G.build_model(a)
llm = LLM.from_model(m, None, max_num_seqs=1, max_num_batched_tokens=2048, collect_routing_stats=False, compile=__import__("os").environ.get("COMP", "1") == "1")
g = torch.Generator().manual_seed(0)
prompt = torch.randint(3, 4096, (40,), generator=g).tolist()
llm.generate([prompt], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
llm.reset_prefix_cache()
llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
for _ in range(10): llm.step()
ts = []; ts2 = []
of = EN.finite_rows
parts = {}
def fr(x):
    t0 = time.perf_counter(); a = torch.empty(1); t1 = time.perf_counter(); s = x.sum(dim=-1); t2 = time.perf_counter()
    f = torch.isfinite(s); t3 = time.perf_counter(); b = bool(f.all()); t4 = time.perf_counter()
    for k, v in (("empty", t1 - t0), ("sum", t2 - t1), ("isfinite", t3 - t2), ("all+bool", t4 - t3)):
        parts.setdefault(k, []).append(v)
    ts.append(t4 - t0)
    t = time.perf_counter(); o = of(x); ts2.append(time.perf_counter() - t)
    return o
EN.finite_rows = fr
for _ in range(60): llm.step()
print({k: round(statistics.median(v)*1e6,1) for k, v in parts.items()}); print("finite_rows first call", round(statistics.median(ts) * 1e6, 1), "us; second call", round(statistics.median(ts2) * 1e6, 1))
print(torch.get_num_threads(), torch._C._get_num_interop_threads() if hasattr(torch._C, "_get_num_interop_threads") else "")
import torch._inductor.config as ic
print("inductor cpp threads", ic.cpp.threads)
import threading
print([t.name for t in threading.enumerate()])
import os
print(os.listdir(f"/proc/{os.getpid()}/task").__len__(), "OS threads")
