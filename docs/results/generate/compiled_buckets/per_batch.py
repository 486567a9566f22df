"""Per-step CPU time of the compiled decode at batch B (argv[1]) vs the eager engine: B prompts of 20 tokens,
40 greedy tokens each, CPU time of 3 generate() calls after one warm-up (sorted), on the benchmark model."""
import sys, time, torch
torch.set_num_threads(1)
from moe.config import ModelConfig
from moe.routing.routers import router_config
from moe.model import Transformer
from moe.engine import LLM, SamplingParams
from moe.engine.runner.compiled import CompiledModelRunner
torch.manual_seed(0)
cfg = ModelConfig(vocab_size=4096, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, n_experts=8, expert_hidden=512,
                  max_seq_len=512, init_std=0.02, router=router_config(top_k=2))
m = Transformer(cfg).eval()
B = int(sys.argv[1])
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(3, 4096, (20,), generator=g).tolist() for _ in range(B)]
p = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
def cpu(llm):
    llm.generate(prompts, p)
    ts = []
    for _ in range(3):
        llm.reset_prefix_cache(); c = time.process_time(); llm.generate(prompts, p); ts.append(time.process_time() - c)
    return sorted(ts)
res = {}
llms = {"eager": LLM.from_model(m, None, max_num_seqs=B, collect_routing_stats=False)}
for gmb in (1, B):  # gathered experts in the graph up to batch 1 (graph pieces) or B (one graph)
    CompiledModelRunner.cpu_max_batch = B  # (measured before this bound existed: no bound)
    CompiledModelRunner.gathered_max_batch = gmb
    llms[f"gathered<={gmb}"] = LLM.from_model(m, None, max_num_seqs=B, collect_routing_stats=False, compile=True)
    llms[f"gathered<={gmb}"].runner.gathered_max_batch = gmb
for k, l in llms.items():
    res[k] = cpu(l)
print(B, {k: [round(x, 3) for x in v] for k, v in res.items()})
