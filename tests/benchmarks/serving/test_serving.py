"""The serving benchmark (`python -m benchmarks.serving`) against the in-process test server: a
small closed-loop level and a Poisson level, the summary statistics, and the Markdown / PNG
reports."""

from __future__ import annotations

import argparse
import asyncio
import math

import pytest

from benchmarks import serving as bench
from tests.serve_fixtures import API_KEY, MODEL_NAME

pytestmark = pytest.mark.timeout(120)


def test_percentiles_and_summary():
    assert bench.pct([], 50) is None
    assert bench.pct([3.0], 99) == 3.0
    assert bench.pct([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert bench.pct(list(range(101)), 99) == pytest.approx(99.0)
    ok = bench.Result(ok=True, prompt_tokens=10, output_tokens=5, ttft=0.1, itl=[0.01, 0.02, 0.03, 0.04], e2e=0.2)
    bad = bench.Result(error="boom")
    s = bench.summarize([ok, ok, bad], duration=2.0)
    assert s["completed"] == 2 and s["failed"] == 1 and s["success_rate"] == pytest.approx(2 / 3)
    assert s["output_throughput"] == 5.0 and s["request_throughput"] == 1.0
    assert s["ttft_ms"]["median"] == pytest.approx(100.0)
    assert s["tpot_ms"]["mean"] == pytest.approx(25.0)  # (0.2 - 0.1) / (5 - 1)
    assert s["itl_ms"]["n"] == 8 and s["errors"] == {"boom": 1}


def test_loopback_only(capsys):
    assert bench.is_loopback("http://127.0.0.1:8000/v1") and bench.is_loopback("http://localhost:1/v1")
    assert bench.is_loopback("http://[::1]:8000/v1")
    assert not bench.is_loopback("http://10.0.0.1:8000/v1") and not bench.is_loopback("https://api.openai.com/v1")
    assert bench.main(["--base-url", "http://192.0.2.1:8000/v1", "--out-dir", "/tmp/never-written-serving-bench"]) == 2
    assert "is not a loopback address" in capsys.readouterr().err  # one line, exit 2 (moe/cli.py)


def test_levels_against_the_server(server, tmp_path):
    import httpx
    from openai import AsyncOpenAI

    args = bench.build_parser().parse_args(["--max-tokens", "4", "--ignore-eos", "--level-timeout", "60",
                                            "--base-url", server.url + "/v1", "--api-key", API_KEY])
    args.endpoint = "chat"
    prompts = bench.load_prompts(args)  # MT-Bench first turns, from ../shared/data
    assert len(prompts) >= 10 and all(isinstance(p, str) and p for p in prompts)

    async def main():
        async with AsyncOpenAI(base_url=args.base_url, api_key=API_KEY, max_retries=0,
                               http_client=httpx.AsyncClient(timeout=60)) as client:
            kept, info = await bench.filter_prompts(args.base_url, API_KEY, MODEL_NAME, prompts[:12], args)
            assert info["max_model_len"] == 512 and 0 < len(kept) <= 12
            closed = await bench.run_level(client, MODEL_NAME, kept[:8], args, concurrency=4)
            poisson = await bench.run_level(client, MODEL_NAME, kept[:4], args, concurrency=None, rate=50.0)
            return closed, poisson

    closed, poisson = asyncio.run(main())
    for lv, n in ((closed, 8), (poisson, 4)):
        assert lv["completed"] == lv["num_requests"] == n, lv["errors"]
        assert lv["total_output_tokens"] == 4 * n  # ignore_eos: every request runs max_tokens
        assert lv["ttft_ms"]["n"] == n and lv["e2e_s"]["p99"] >= lv["e2e_s"]["median"] > 0
        assert lv["output_throughput"] > 0 and not math.isnan(lv["request_throughput"])
    assert closed["concurrency"] == 4 and poisson["request_rate"] == 50.0
    table = bench.levels_table([closed, poisson])
    assert table.count("\n") == 4 and "| 4 | 8 / 8 (100%) |" in table and "50 req/s" in table
    bench.plot([closed, poisson], tmp_path / "p.png", "test")
    assert (tmp_path / "p.png").stat().st_size > 5000


def test_corpus_prompts(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("\n\n".join(f"paragraph {i} " * 20 for i in range(30)))
    args = argparse.Namespace(corpus=str(f), corpus_chars=300)
    chunks = bench.load_prompts(args)
    assert len(chunks) > 5 and all(0 < len(c) <= 300 for c in chunks)
