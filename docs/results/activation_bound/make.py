"""The planner's activation formula against the meta-device estimate it bounds, on the three
published configs of docs/results/memory_plans/ (bf16, max_num_seqs 64) and on the configs of
tests/engine/memory/test_activation_formula.py. Arithmetic on meta tensors: no weights, no forward
on a device; the same numbers on any machine.

    PYTHONPATH=$PWD python docs/results/activation_bound/make.py > docs/results/activation_bound/bound.json
"""
import dataclasses
import json
import os
import platform
import subprocess
import time

import torch

from moe.engine.memory.activation_formula import peak_activation_bytes
from moe.engine.memory.memory_profile import estimate_peak_activations
from moe.engine.memory.plan import read_model_config
from moe.engine.memory.plan_quant import planned_model
from moe.meta import meta_device
from moe.model import Transformer
from moe.variants import resolve_model
from tests.conftest import tiny_model_config
from tests.engine.memory.test_activation_formula import CASES, SHAPES

GiB = 2 ** 30
out = {"command": "PYTHONPATH=$PWD python docs/results/activation_bound/make.py",
       "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
       "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                   "loadavg_start": open("/proc/loadavg").read().split()[:3]},
       "published": [], "test_cases": []}
for name in ("mixtral-8x7b", "qwen3-30b-a3b", "olmoe-1b-7b"):
    cfg = read_model_config(f"benchmarks/model_configs/{name}")
    for tokens in (2048, 16384, 32768):
        model = planned_model(cfg, torch.bfloat16)
        estimate = estimate_peak_activations(model, tokens, 64)
        bound = peak_activation_bytes(model.cfg, tokens, 64, 2)
        out["published"].append(dict(model=name, max_num_batched_tokens=tokens, max_num_seqs=64, dtype="bf16",
                                     meta_estimate_bytes=estimate, formula_bytes=bound,
                                     meta_estimate_gib=round(estimate / GiB, 2), formula_gib=round(bound / GiB, 2),
                                     formula_over_estimate=round(bound / estimate, 4)))
for case in sorted(CASES):
    cfg = resolve_model(dataclasses.replace(tiny_model_config(**CASES[case]), max_seq_len=512))
    for tokens, rows, dtype in SHAPES:
        with meta_device():
            model = Transformer(cfg).to(dtype).eval()
        estimate = estimate_peak_activations(model, tokens, rows)
        bound = peak_activation_bytes(cfg, tokens, rows, torch.empty((), dtype=dtype).element_size())
        out["test_cases"].append(dict(case=case, tokens=tokens, rows=rows, dtype=str(dtype), meta_estimate_bytes=estimate,
                                      formula_bytes=bound, formula_over_estimate=round(bound / estimate, 4)))
ratios = [r["formula_over_estimate"] for r in out["published"]]
out["published_ratio_min_max"] = [min(ratios), max(ratios)]
ratios = [r["formula_over_estimate"] for r in out["test_cases"]]
out["test_cases_ratio_min_max"] = [min(ratios), max(ratios)]
out["machine"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
out["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
print(json.dumps(out, indent=1))
