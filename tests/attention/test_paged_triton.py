"""`moe/attention/paged_triton.py`: the `triton` paged backend agrees with the `torch` one through
the registry, and refuses clearly (at configuration) where its kernels cannot run."""

import pytest
import torch

from kernels.runtime import triton
from moe.attention import PAGED_BACKENDS, paged_backend
from moe.attention.paged_triton import TritonPagedAttention
from moe.errors import ConfigError
from tests.kernels.paged_attention.cases import DEVICE, TOL, make_cache, make_tables, needs_triton


@needs_triton
def test_backends_agree_through_the_registry():
    torch_be, triton_be = paged_backend("torch", "cpu"), paged_backend("triton", "cpu")
    assert paged_backend("auto", torch.device("cpu")).name == "torch"
    G, d, bs = 2, 64, 16
    kc, vc = make_cache(10, bs, G, d, torch.float32)
    lens = [9, 30]
    bt = make_tables(lens, bs, 10)
    cl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 9, 12], dtype=torch.int32, device=DEVICE)
    q = torch.randn(12, 4, d, device=DEVICE)
    a = torch_be.prefill(q, kc, vc, bt, cu, cl, 0.125, 9)
    b = triton_be.prefill(q, kc, vc, bt, cu, cl, 0.125, 9)
    torch.testing.assert_close(a, b, **TOL[torch.float32])


@pytest.mark.skipif(triton is None or torch.cuda.is_available(), reason="checks the CPU-without-interpreter error")
def test_triton_backend_on_cpu_without_interpreter_says_so(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ConfigError, match="attention_backend='triton' with device=cpu.*CUDA"):
        TritonPagedAttention().check_config(16, 16, torch.float32, torch.device("cpu"))
    assert "TRITON_INTERPRET=1" in PAGED_BACKENDS.unavailable_reason("triton")
