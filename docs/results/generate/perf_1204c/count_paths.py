"""How many batch-1 decode attention calls take the view (consecutive blocks) and how many the gather, in
`benchmarks.generate --num-prompts 6 --max-num-seqs 1 --hf none --threads 1 --repeats 1` (its warm-up and
timed run): a wrapper counts `contiguous_span`'s answers. Run from the repository root:
    PYTHONPATH=$PWD python docs/results/generate/perf_1204c/count_paths.py"""
import torch

import moe.attention.paged_torch as PT
from benchmarks import generate as G

counts = {"view": 0, "gather": 0}
real = PT.contiguous_span


def counted(*a, **k):
    span = real(*a, **k)
    counts["view" if span is not None else "gather"] += 1
    return span


PT.contiguous_span = counted
torch.set_num_threads(1)
G.main(["--num-prompts", "6", "--max-num-seqs", "1", "--hf", "none", "--threads", "1", "--repeats", "1"])
print(counts)
