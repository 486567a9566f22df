"""The server soak (benchmarks/soak.py), bounded: three rounds of 200 concurrent streaming
clients against a real `python -m moe.serve` process on loopback, a third disconnecting at
random points and a few sending bad requests. After every round each request completed, was
aborted or (the bad ones) got a 400; no 5xx; the KV cache is back to 0 blocks; and the server's
RSS did not grow more than 10% from the second round to the third."""

from __future__ import annotations

import asyncio
import json

import pytest

from benchmarks.soak import RSS_GROWTH_LIMIT, Outcome, Round, round_record, rss_growth, soak, start_server, tiny_checkpoint


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


def test_round_record_holds_the_tables_columns_and_the_problems():
    """What `--json` writes per round: the counts the table prints (from the outcomes) and the problems."""
    outcomes = [Outcome(status=200, done=True)] * 3 + [Outcome(disconnected=True)] * 2 + [
        Outcome(bad=True, status=400), Outcome(bad=True, status=500)]
    r = Round(clients=7, seconds=1.5, outcomes=outcomes, finished={"length": 3, "abort": 1}, server_5xx=1.0,
              kv_blocks_used=0.0, pending=0.0, rss=2**20)
    rec = round_record(r)
    assert {k: rec[k] for k in ("clients", "completed", "disconnected", "aborted_in_engine", "bad_rejected",
                                "server_5xx", "rss_bytes")} == {
        "clients": 7, "completed": 3, "disconnected": 2, "aborted_in_engine": 1, "bad_rejected": 1,
        "server_5xx": 1, "rss_bytes": 2**20}
    assert rec["problems"] == r.problems() and len(rec["problems"]) == 2  # the 500: not a 400, and a 5xx
    assert json.loads(json.dumps(rec)) == rec  # plain JSON


def test_main_writes_json_only_when_asked(tmp_path, monkeypatch):
    """`--json`: the settings, every round, the RSS growth and the problems go to the record."""
    import benchmarks.soak as soak_mod

    class Proc:
        pid = 1

        def terminate(self):
            pass

        def wait(self, timeout):
            pass

    ok = [Outcome(status=200, done=True)]
    rounds = [Round(clients=1, seconds=1.0, outcomes=ok, finished={"stop": 1}, kv_blocks_used=0.0, pending=0.0,
                    rss=rss) for rss in (100, 100, 120)]  # +20% from round 1 to the last: over the limit

    async def fake_soak(*a, **k):
        return rounds

    calls = []
    monkeypatch.setattr(soak_mod, "tiny_checkpoint", lambda d: d)
    monkeypatch.setattr(soak_mod, "start_server", lambda *a: (Proc(), "http://x"))
    monkeypatch.setattr(soak_mod, "soak", fake_soak)
    monkeypatch.setattr(soak_mod, "finish_record", lambda *a: calls.append(a))
    assert soak_mod.main(["--rounds", "3"]) == 1 and calls == []
    assert soak_mod.main(["--rounds", "3", "--json", str(tmp_path / "s.json")]) == 1 and len(calls) == 1
    record, path, _ = calls[0]
    assert path == str(tmp_path / "s.json") and record["settings"]["rounds"] == 3
    assert [r["rss_bytes"] for r in record["rounds"]] == [100, 100, 120]
    assert record["rss_growth"] == pytest.approx(0.2) and record["problems"] == ["RSS grew 20.0% (limit 10%)"]
