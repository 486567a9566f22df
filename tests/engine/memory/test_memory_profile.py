"""The planner's activation estimate (meta tensors, moe.engine.memory.memory_profile) against the peak a
real CPU forward of the same model reaches, measured by the kernel (peak RSS), and its accounting."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe.config.schema import ModelConfig
from moe.engine.memory.memory_profile import PeakMemory, estimate_peak_activations
from moe.model import Transformer
from tests.record import record_measurement

CFG = dict(vocab_size=1024, d_model=256, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=8, expert_hidden=512,
           max_seq_len=8192)
TOKENS, ROWS = 2048, 16

# Run in a fresh process whose allocator returns every large block to the OS on free
# (MALLOC_MMAP_THRESHOLD_), so the kernel's peak RSS (VmHWM, reset first) is the forward's peak.
MEASURE = f"""
import json, torch
from moe.config.schema import ModelConfig
from moe.engine.memory.memory_profile import _dummy_forward
from moe.model import Transformer
torch.set_num_threads(1)
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
torch.manual_seed(0)
model = Transformer(ModelConfig(**{CFG!r})).eval()
with torch.inference_mode():
    _dummy_forward(model, 256, {ROWS}, "cpu")  # one-time allocations (kernel workspaces) happen here
    open("/proc/self/clear_refs", "w").write("5")
    base = status("VmRSS")
    _dummy_forward(model, {TOKENS}, {ROWS}, "cpu")
    print(json.dumps(status("VmHWM") - base))
"""


@pytest.mark.slow  # a fresh process (imports torch): ~10 s of CPU
@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux /proc/self/clear_refs")
def test_estimate_matches_a_measured_cpu_forward():
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", MEASURE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    with torch.device("meta"):
        model = Transformer(ModelConfig(**CFG))
    estimate = estimate_peak_activations(model, TOKENS, ROWS)
    record_measurement("memory_profile", {"tokens": TOKENS, "rows": ROWS, "measured_bytes": measured,
                                          "estimated_bytes": estimate, "estimate_over_measured": estimate / measured})
    assert measured > 30 * 2**20  # activations dominate what the process allocates besides
    assert estimate == pytest.approx(measured, rel=0.10)  # measured: within 1%


def test_peak_memory_counts_allocations_views_and_frees():
    base = torch.zeros(1000)  # made before: a view of it is no allocation
    with PeakMemory() as mem:
        a = torch.empty(250_000)  # 1 MB
        v = a[10:]  # a view: no new memory
        b = torch.empty(500_000)  # 2 MB
        w = base[:10]
        assert mem.current == 3_000_000
        del a  # still held by the view
        assert mem.current == 3_000_000
        del v
        assert mem.current == 2_000_000
        c = b * 2  # 2 MB more
        del b, c, w
    assert mem.peak == 4_000_000 and mem.current == 0
