"""The compiled `small` engine at batch 1 with its graph replaced by a stand-in returning fixed logits: the torch
calls a step makes outside the graph (profiler counts) and the step's and `execute`'s medians with warm caches.
Run at 39e3c65 from the repository root: OMP_NUM_THREADS=1 PYTHONPATH=$PWD python <this file>"""
import sys, time, torch, statistics, os
sys.argv = [sys.argv[0]]
import benchmarks.generate as G
from moe.engine import LLM, SamplingParams
from torch.profiler import profile, ProfilerActivity
torch.set_num_threads(1)
class A: pass
a = A(); a.checkpoint=None; a.vocab=4096; a.d_model=512; a.n_layers=8; a.n_heads=8; a.n_kv_heads=4; a.n_experts=8
a.expert_hidden=768; a.init_std=0.02; a.top_k=2; a.device='cpu'; a.torch_dtype=torch.float32
m, _ = G.build_model(a)
comp = os.environ.get("COMP", "1") == "1"
llm = LLM.from_model(m, None, max_num_seqs=1, max_num_batched_tokens=2048, collect_routing_stats=False, compile=comp)
g = torch.Generator().manual_seed(0)
prompt = torch.randint(3, 4096, (40,), generator=g).tolist()
llm.generate([prompt], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
llm.reset_prefix_cache()
llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
for _ in range(10): llm.step()
r = llm.runner
if comp:
    fixed = torch.randn(1, 4096)
    r.calls.call = lambda *a_: fixed
else:
    fixed = torch.randn(1, 1, 4096)
    r.model.forward = lambda *a_, **k: type("O", (), {"logits": fixed, "moe_records": []})()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(20): llm.step()
ka = [e for e in prof.key_averages() if e.key.startswith("aten::")]
tot = sum(e.count for e in ka if e.cpu_parent is None) if False else None
rows = sorted(((e.count / 20, e.key) for e in ka), reverse=True)
print("aten op calls per step (incl. nested):", round(sum(c for c, _ in rows), 1))
for c, k in rows[:30]: print(f"  {c:6.1f} {k}")
oe = r.execute
ex_t = []
def ex(b):
    t = time.perf_counter(); o = oe(b); ex_t.append(time.perf_counter() - t); return o
r.execute = ex
st = []
for _ in range(60):
    t = time.perf_counter(); llm.step(); st.append(time.perf_counter() - t)
print("stubbed: step", round(statistics.median(st) * 1e6), "us, execute", round(statistics.median(ex_t) * 1e6), "us")
