"""Issue 36 item 2: the CPU cost of one engine step, plain vs `speculative="mtp"`, and where an mtp
step's time goes (the served model's forward, the MTP module's runs), with the one-token expert
swap of the MTP runners on (this commit) and off (what the code did before: the runner found no
experts to swap). Interleaved: each repeat runs every arm once, in turn.

    PYTHONPATH=. OMP_NUM_THREADS=1 python docs/results/mtp/overhead/step_cost.py OUT.json

The model is the `tiny` shape (d_model 128, 4 layers, 8 experts of 128, top-2, vocab 4096) with
one MTP module, random weights: acceptance is ~0, as on the tiny record's prose (0.04), and the
cost of a step does not depend on what the weights say.
"""

import collections
import json
import os
import statistics
import sys
import time

import torch

from moe.config import ModelConfig
from moe.engine import LLM, SamplingParams
from moe.engine.runner.model_runner import ModelRunner
from moe.engine.speculative import mtp as mtp_mod
from moe.model import Transformer
from moe.routing.routers import router_config

torch.set_num_threads(1)
torch.manual_seed(0)
cfg = ModelConfig(vocab_size=4096, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, n_experts=8, expert_hidden=128,
                  max_seq_len=512, router=router_config(top_k=2), mtp_depth=1)
model = Transformer(cfg).eval()
g = torch.Generator().manual_seed(1)
prompts = [torch.randint(3, 4096, (96,), generator=g).tolist() for _ in range(4)]
params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)

cpu_in = collections.defaultdict(float)  # CPU seconds per kind of runner call, of the arm being timed
execute = ModelRunner.execute


def timed_execute(self, batch):
    kind = "mtp_module" if isinstance(self.model, mtp_mod.MTPDraftLayer) else "served_model"
    t = time.process_time()
    out = execute(self, batch)
    cpu_in[kind] += time.process_time() - t
    return out


ModelRunner.execute = timed_execute


def build(name):
    spec = None if name == "plain" else {"method": "mtp", "num_tokens": int(name.split("k")[1].split("_")[0])}
    llm = LLM.from_model(model, None, max_num_seqs=1, collect_routing_stats=False, speculative=spec)
    if name.endswith("_noswap"):
        for r in llm.spec.proposers[("mtp",)].runners:
            r._experts = []  # the runner before this commit: the grouped call over every expert at one token
    llm.generate(prompts[:1], params)  # warm-up
    return llm


arms = ["plain", "mtp_k1", "mtp_k1_noswap", "mtp_k4", "mtp_k4_noswap"]
engines = {a: build(a) for a in arms}
runs = {a: [] for a in arms}
ref = None
for rep in range(int(os.environ.get("REPEATS", 3))):
    for a in arms:
        llm = engines[a]
        llm.reset_prefix_cache()
        llm.reset_stats()
        cpu_in.clear()
        w, c = time.perf_counter(), time.process_time()
        out = [o.token_ids for o in llm.generate(prompts, params)]
        wall, cpu = time.perf_counter() - w, time.process_time() - c
        ref = ref or out
        assert out == ref, f"{a}: output differs from the plain engine's"
        st = llm.stats()
        runs[a].append(dict(wall_s=wall, cpu_s=cpu, steps=st["num_steps"], cpu_ms_per_step=1000 * cpu / st["num_steps"],
                            served_model_cpu_s=cpu_in["served_model"], mtp_module_cpu_s=cpu_in["mtp_module"],
                            acceptance=st.get("spec_acceptance_rate")))
summary = {}
for a in arms:
    ms = [r["cpu_ms_per_step"] for r in runs[a]]
    summary[a] = dict(cpu_ms_per_step_median=statistics.median(ms), min=min(ms), max=max(ms),
                      vs_plain_cpu=statistics.median(r["cpu_s"] for r in runs["plain"]) /
                      statistics.median(r["cpu_s"] for r in runs[a]),
                      mtp_module_share=statistics.median(r["mtp_module_cpu_s"] / r["cpu_s"] for r in runs[a]),
                      served_model_share=statistics.median(r["served_model_cpu_s"] / r["cpu_s"] for r in runs[a]))
    print(a, {k: round(v, 3) for k, v in summary[a].items()})
with open(sys.argv[1], "w") as f:
    json.dump(dict(summary=summary, runs=runs, loadavg=open("/proc/loadavg").read().strip()), f, indent=2)
