"""Smoke run of benchmarks/paged_attention.py on CPU under the Triton interpreter (tests/conftest.py
sets TRITON_INTERPRET=1 without CUDA): every code path the GPU run takes (reference check, SDPA
peer on the same K/V, JSON rows) runs before a GPU minute is spent on it. Timings are not checked."""

import json

import pytest
import torch

pytest.importorskip("triton")

from benchmarks import paged_attention as bench  # noqa: E402


def test_cpu_smoke_run_writes_rows_for_every_shape(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("runs the CPU smoke path only")
    out = tmp_path / "pa.json"
    rc = bench.main(["--device", "cpu", "--batch", "1", "3", "--context", "1", "37", "--n-heads", "4",
                     "--n-kv-heads", "2", "--head-dim", "32", "--iters", "2", "--copies", "3", "--json", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert [(row["batch"], row["context"]) for row in r["rows"]] == [(1, 1), (1, 37), (3, 1), (3, 37)]
    for row in r["rows"]:
        assert row["copies"] == 3  # the K/V sets timed in rotation (on a GPU: enough to outgrow L2)
        assert row["triton_us"] > 0 and row["sdpa_us"] > 0 and row["triton_gbps"] > 0
    assert r["copy_gbps"] > 0 and r["flash_attn"] != "yes"  # flash-attn is never timed on CPU


def test_sdpa_peer_matches_the_paged_reference():
    from kernels import paged_attention as pa

    g = torch.Generator().manual_seed(0)
    S, H, G, d, bs, ctx = 3, 8, 2, 16, 4, 11
    nb = S * 3
    kc, vc = torch.randn(nb, bs, G, d, generator=g), torch.randn(nb, bs, G, d, generator=g)
    tables = torch.randperm(nb, generator=g).to(torch.int32).view(S, 3)
    q = torch.randn(S, H, d, generator=g)
    lens = torch.full((S,), ctx, dtype=torch.int32)
    ref = pa.paged_attention_decode_torch(q, kc, vc, tables, lens, 0.25)
    k = pa.gather_cache(kc, tables)[:, :ctx].permute(0, 2, 1, 3)
    v = pa.gather_cache(vc, tables)[:, :ctx].permute(0, 2, 1, 3)
    torch.testing.assert_close(bench.sdpa_dense_decode(q, k, v, 0.25), ref, atol=1e-5, rtol=1e-5)
