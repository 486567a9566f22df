"""cProfile of the engine's batch-1 run, prefill vs decode CPU time (this record's "Batch 1" section):
    PYTHONPATH=<after checkout> python docs/results/generate/dec_1204/profile_b1.py"""
import sys, cProfile, pstats, torch, time, argparse
torch.set_num_threads(1)
from benchmarks.generate import build_model, workload
from moe.engine import LLM, SamplingParams
args = argparse.Namespace(checkpoint=None, device="cpu", torch_dtype=torch.float32, vocab=4096, d_model=256, n_layers=4, n_heads=8,
    n_kv_heads=4, n_experts=8, expert_hidden=512, init_std=0.02, top_k=2, seed=0, num_prompts=6, min_prompt=8, max_prompt=64, min_out=16, max_out=128)
model, _ = build_model(args)
prompts, lens = workload(args, 4096)
llm = LLM.from_model(model, None, max_num_seqs=1, collect_routing_stats=False)
params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens]
llm.generate(prompts[:4], params[:4])
import moe.engine.runner.model_runner as mr
orig = mr.ModelRunner.execute
pre = {"prefill": 0.0, "decode": 0.0, "np": 0, "nd": 0}
def timed_exec(self, batch):
    t = time.process_time(); r = orig(self, batch); dt = time.process_time() - t
    k = "decode" if batch.num_decodes == len(batch.seqs) else "prefill"
    pre[k] += dt; pre["n" + k[0]] += 1
    return r
mr.ModelRunner.execute = timed_exec
llm.reset_prefix_cache()
t = time.process_time(); pr = cProfile.Profile(); pr.enable(); llm.generate(prompts, params); pr.disable(); tot = time.process_time() - t
print("total cpu", tot, pre)
pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
