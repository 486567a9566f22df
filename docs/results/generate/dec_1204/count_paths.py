"""Which decode attention path the batch-1 benchmark takes (this record's "Batch 1" section):
    PYTHONPATH=<after checkout> python docs/results/generate/dec_1204/count_paths.py"""
import sys, collections, torch
sys.argv = ["x"]
torch.set_num_threads(1)
import moe.attention.paged_torch as pt
from benchmarks.generate import build_model, workload
from moe.engine import LLM, SamplingParams
import argparse
args = argparse.Namespace(checkpoint=None, device="cpu", torch_dtype=torch.float32, vocab=4096, d_model=256, n_layers=4, n_heads=8,
    n_kv_heads=4, n_experts=8, expert_hidden=512, init_std=0.02, top_k=2, seed=0, num_prompts=6, min_prompt=8, max_prompt=64, min_out=16, max_out=128)
model, _ = build_model(args)
prompts, lens = workload(args, 4096)
calls = collections.Counter()
for name in ("decode_contiguous", "decode_gathered"):
    real = getattr(pt, name)
    setattr(pt, name, (lambda real, name: lambda *a: calls.update([name]) or real(*a))(real, name))
llm = LLM.from_model(model, None, max_num_seqs=1, collect_routing_stats=False)
params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens]
llm.generate(prompts[:4], params[:4]); print("warmup", calls); calls.clear()
for r in range(2):
    llm.reset_prefix_cache(); llm.generate(prompts, params); print("run", r, calls); calls.clear()
