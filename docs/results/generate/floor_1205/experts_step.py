"""The experts of every layer of one decode step, alone: the eager dispatches (`sorted`, and the one-token
`active_experts_dispatch` the eager runner swaps in at batch 1) against the compiled step's (`gathered_experts`,
`selected_experts` (one token only), the opaque `sorted` op), each layer's output added to the next's input.
Args: model (tiny | small) and tokens T; wall ms of the L layers, median of 30 calls, three rounds.
"""
import torch, time, statistics, sys
import torch.nn.functional as F
from moe.engine.runner.compiled import gathered_experts, opaque_experts, selected_experts
from moe.engine.runner.decode_experts import active_experts_dispatch
from moe.experts.sorted import sorted_dispatch
import os; torch.set_num_threads(int(os.environ.get("NT", "1")))
torch._dynamo.config.capture_scalar_outputs = True
torch._dynamo.config.recompile_limit = 64
model = sys.argv[1]; T = int(sys.argv[2])
E,D,H,L = (8,256,512,4) if model == "tiny" else (8,512,768,8)
K=2
gus=[torch.randn(E,2*H,D)*0.03 for _ in range(L)]; dns=[torch.randn(E,D,H)*0.03 for _ in range(L)]
x=torch.randn(T,D)
g=torch.Generator().manual_seed(0)
sel=[torch.stack([torch.randperm(E,generator=g)[:K] for _ in range(T)]) for _ in range(L)]
w=torch.rand(T,K)
opq = lambda x, ex, w, gu, dn: opaque_experts(x, ex, w, gu, dn, "sorted")
def layers(f):
    def run(x):
        for l in range(L): x = x + f(x,sel[l],w,gus[l],dns[l])
        return x
    return run
variants = {"eager_sorted": layers(sorted_dispatch), "eager_active": layers(active_experts_dispatch),
            "c_gathered": torch.compile(layers(gathered_experts), dynamic=False),
            "c_selected": torch.compile(layers(selected_experts), dynamic=False),
            "c_opaque": torch.compile(layers(opq), dynamic=False)}
with torch.inference_mode():
  ref = variants["eager_sorted"](x)
  for n, f in variants.items(): print(n, "maxdiff", (f(x)-ref).abs().max().item())
  res = {n: [] for n in variants}
  for r in range(3):
    for n, f in variants.items():
      for _ in range(5): f(x)
      ts=[]
      for _ in range(30):
        t=time.perf_counter(); f(x); ts.append(time.perf_counter()-t)
      res[n].append(statistics.median(ts)*1e3)
  for n, v in res.items(): print(model, T, n, [round(a,3) for a in v])
