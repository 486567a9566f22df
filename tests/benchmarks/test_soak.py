"""The server soak (benchmarks/soak.py), bounded: three rounds of 200 concurrent streaming
clients against a real `python -m moe.serve` process on loopback, a third disconnecting at
random points and a few sending bad requests. After every round each request completed, was
aborted or (the bad ones) got a 400; no 5xx; the KV cache is back to 0 blocks; and the server's
RSS did not grow more than 10% from the second round to the third."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.soak import RSS_GROWTH_LIMIT, rss_growth, soak, start_server, tiny_checkpoint


@pytest.mark.slow
def test_200_streaming_clients_with_disconnects_leak_nothing(tmp_path):
    pytest.importorskip("httpx")
    proc, url = start_server(tiny_checkpoint(tmp_path), "", tmp_path / "server.log")
    try:
        rounds = asyncio.run(soak(url, proc.pid, clients=200, rounds=3, disconnect=1 / 3, bad=0.05, max_tokens=48,
                                  seed=0, report=print))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    for r in rounds:
        assert r.problems() == []
        assert len(r.outcomes) == 200 and r.completed + r.disconnected + r.rejected == 200
        assert r.disconnected >= 30 and r.rejected >= 3  # the faults happened (seeded: same counts every run)
        assert r.kv_blocks_used == 0 and r.pending == 0 and r.server_5xx == 0
    assert sum(r.finished.get("abort", 0) for r in rounds) > 0  # disconnects reached the engine as aborts
    assert rss_growth(rounds) <= RSS_GROWTH_LIMIT
