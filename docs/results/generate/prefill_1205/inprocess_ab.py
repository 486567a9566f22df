"""In one process, the eager engine on issue 32's `small` batch-1 workload under the new prefill rule and the
previous one (padded below `max_padded_scores`), alternated over four rounds: each generate's CPU time and the
CPU time inside the backend's prefill calls. Run from the repository root:
  OMP_NUM_THREADS=1 PYTHONPATH=$PWD python docs/results/generate/prefill_1205/inprocess_ab.py"""
import sys, time, torch, statistics
sys.argv = [sys.argv[0]]
import benchmarks.generate as G
from moe.engine import LLM, SamplingParams
from moe.attention.paged_torch import TorchPagedAttention
torch.set_num_threads(1)
class A: pass
a = A(); a.checkpoint=None; a.vocab=4096; a.d_model=512; a.n_layers=8; a.n_heads=8; a.n_kv_heads=4; a.n_experts=8
a.expert_hidden=768; a.init_std=0.02; a.top_k=2; a.device='cpu'; a.torch_dtype=torch.float32
a.num_prompts=6; a.min_prompt=8; a.max_prompt=64; a.min_out=16; a.max_out=128; a.seed=0
m, _ = G.build_model(a)
prompts, lens = G.workload(a, 4096)
llm = LLM.from_model(m, None, max_num_seqs=1, max_num_batched_tokens=2048, collect_routing_stats=False)
params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens]
new = TorchPagedAttention.per_sequence
def old(self, q, bt, mq, bs):
    return bt.shape[0] * q.shape[1] * mq * bt.shape[1] * bs > self.max_padded_scores
pre = {"new": [], "old": []}; tot = {"new": [], "old": []}
be = llm.runner.context.backend
op = type(be).prefill
cur = [0.0]
def prefill(self, *a_, **k):
    t = time.process_time(); o = op(self, *a_, **k); cur[0] += time.process_time() - t; return o
type(be).prefill = prefill
llm.generate(prompts[:2], params[:2])
for r in range(4):
    for arm, fn in (("new", new), ("old", old)) if r % 2 == 0 else (("old", old), ("new", new)):
        TorchPagedAttention.per_sequence = fn
        llm.reset_prefix_cache(); cur[0] = 0.0
        t = time.process_time(); outs = llm.generate(prompts, params); tot[arm].append(time.process_time() - t)
        pre[arm].append(cur[0])
for arm in tot:
    print(arm, "total", [round(x, 3) for x in tot[arm]], "prefill attn", [round(x * 1e3, 1) for x in pre[arm]])
