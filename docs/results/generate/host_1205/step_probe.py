"""One compiled `small` engine at batch 1: the median over 300 decode steps of the whole step, of the runner's
`execute` and of the compiled call inside it (wall clock, microseconds), and what lies between them (host work).
Run from the root of the tree to measure: OMP_NUM_THREADS=1 PYTHONPATH=$PWD python <this file>"""
import sys, time, torch, statistics
sys.argv = [sys.argv[0]]
import benchmarks.generate as G
from moe.engine import LLM, SamplingParams
torch.set_num_threads(1)
class A: pass
a = A(); a.checkpoint=None; a.vocab=4096; a.d_model=512; a.n_layers=8; a.n_heads=8; a.n_kv_heads=4; a.n_experts=8
a.expert_hidden=768; a.init_std=0.02; a.top_k=2; a.device='cpu'; a.torch_dtype=torch.float32
m, _ = G.build_model(a)
llm = LLM.from_model(m, None, max_num_seqs=1, max_num_batched_tokens=2048, collect_routing_stats=False, compile=True)
g = torch.Generator().manual_seed(0)
prompt = torch.randint(3, 4096, (40,), generator=g).tolist()
llm.generate([prompt], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
r = llm.runner
acc = {"step": [], "execute": [], "call": []}; cur = {}
oc = r.calls.call
def call(*a_):
    t = time.perf_counter(); o = oc(*a_); cur["call"] = time.perf_counter() - t; return o
r.calls.call = call
oe = r.execute
def ex(b):
    t = time.perf_counter(); o = oe(b); cur["execute"] = time.perf_counter() - t; return o
r.execute = ex
for rep in range(3):
    llm.reset_prefix_cache()
    llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=110, ignore_eos=True))
    for _ in range(5): llm.step()
    for _ in range(100):
        t = time.perf_counter(); llm.step(); cur["step"] = time.perf_counter() - t
        for k in acc: acc[k].append(cur[k])
    while llm.has_unfinished_requests() if hasattr(llm, "has_unfinished_requests") else False: llm.step()
    for _ in range(10): llm.step()
med = {k: statistics.median(v) * 1e6 for k, v in acc.items()}
print({k: round(v) for k, v in med.items()}, "execute-call", round(med["execute"] - med["call"]), "step-execute", round(med["step"] - med["execute"]))
