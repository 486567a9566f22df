"""Server soak: rounds of concurrent streaming clients against `python -m moe.serve` on loopback,
a share of them disconnecting at random points and a few sending bad requests, and after each
round the checks that nothing leaked: every request completed, was aborted or (a bad one) got a
400, no 5xx, the KV cache back to 0 blocks, the server process's memory flat.

    python -m benchmarks.soak [--checkpoint CKPT] [--clients 200] [--rounds 10] [--disconnect 0.33]
                              [--bad 0.05] [--max-tokens 32] [--seed 0] [--server-args "--threads 2"]

Without --checkpoint it serves a tiny random model (a BPE tokenizer trained on a paragraph and
a 2-layer MoE), which is enough to exercise the server: the engine's scheduling, streaming and
aborts do not depend on the weights. Clients disconnect in two ways, at random: before the
response starts (the request task is cancelled after a random delay) or after a random number
of streamed chunks. Bad requests: a negative max_tokens, a temperature below 0, malformed JSON. Prints one row per round and exits 1 when a check fails.
tests/benchmarks/test_soak.py runs a bounded version (3 rounds of 200 clients).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import torch

from benchmarks.serving.server import launch_server, scrape, wait_ready
from benchmarks.timing import finish_record
from moe.checkpoint import checkpoint_path, save_checkpoint, tokenizer_files
from moe.config import Config, ModelConfig, to_dict
from moe.data import Tokenizer
from moe.model import Transformer
from moe.report import markdown_table

M = "moe_serve_"
WORDS = ("the quick brown fox jumps over the lazy dog once upon a time a little girl found a red ball "
         "experts route tokens the router picks the top k she was happy and they played all day").split()
RSS_GROWTH_LIMIT = 0.10
BAD_BODIES = ({"max_tokens": -1}, {"temperature": -0.5}, "{not json")


def tiny_checkpoint(directory: Path, seed: int = 0) -> Path:
    """A checkpoint of a tiny random MoE with a small BPE tokenizer (what `moe.serve` loads)."""
    tok = Tokenizer.train([" ".join(WORDS)] * 20, vocab_size=320)
    torch.manual_seed(seed)
    cfg = Config(model=ModelConfig(vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                   n_experts=4, expert_hidden=64, max_seq_len=256))
    model = Transformer(cfg.model)
    return save_checkpoint(checkpoint_path(directory, 0), {"model": model.state_dict(), "config": to_dict(cfg),
                                                            "tokenizer": tokenizer_files(tok), "step": 0})


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@dataclass
class Outcome:
    status: Optional[int] = None
    chunks: int = 0
    done: bool = False  # saw `data: [DONE]` after a finish_reason
    disconnected: bool = False
    bad: bool = False  # sent a bad request on purpose (expects a 400)
    error: str = ""


async def one_client(http, url: str, rng: random.Random, max_tokens: int, plan: Optional[tuple]) -> Outcome:
    """One streamed completion; `plan` = ("early", seconds) cancels the request after that delay
    (often before the response starts), ("chunks", k) closes the stream after k chunks, ("bad",
    i) sends BAD_BODIES[i] instead."""
    out = Outcome(bad=bool(plan and plan[0] == "bad"))
    body = {"prompt": " ".join(rng.choices(WORDS, k=rng.randint(3, 24))), "stream": True, "ignore_eos": True,
            "max_tokens": rng.randint(2, max_tokens), "temperature": 1.0, "seed": rng.randrange(1 << 30)}
    if out.bad:
        bad = BAD_BODIES[plan[1]]
        try:
            r = await (http.post(url + "/v1/completions", content=bad, headers={"Content-Type": "application/json"})
                       if isinstance(bad, str) else http.post(url + "/v1/completions", json={**body, **bad}))
            out.status = r.status_code
        except Exception as e:  # noqa: BLE001
            out.error = f"{type(e).__name__}: {e}"[:200]
        return out

    async def stream():
        finished = False
        async with http.stream("POST", url + "/v1/completions", json=body) as r:
            out.status = r.status_code
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    out.done = finished
                    return
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    out.error = str(chunk["error"])[:200]
                    continue
                out.chunks += 1
                finished = finished or any(c.get("finish_reason") for c in chunk.get("choices", []))
                if plan and plan[0] == "chunks" and out.chunks >= plan[1]:
                    out.disconnected = True
                    return  # leaving the block closes the connection mid-stream

    try:
        if plan and plan[0] == "early":
            try:
                await asyncio.wait_for(stream(), timeout=plan[1])
            except asyncio.TimeoutError:
                out.disconnected = True
        else:
            await stream()
    except Exception as e:  # noqa: BLE001  a failure is a finding, reported, never fatal here
        out.error = f"{type(e).__name__}: {e}"[:200]
    return out


@dataclass
class Round:
    clients: int
    seconds: float
    outcomes: list[Outcome] = field(default_factory=list)
    finished: dict = field(default_factory=dict)  # server: engine requests finished this round, by reason
    server_5xx: float = 0.0
    kv_blocks_used: float = -1.0
    pending: float = -1.0
    rss: int = 0

    @property
    def completed(self) -> int:
        return sum(o.done for o in self.outcomes)

    @property
    def disconnected(self) -> int:
        return sum(o.disconnected and not o.done for o in self.outcomes)

    @property
    def rejected(self) -> int:
        return sum(o.bad and o.status == 400 for o in self.outcomes)

    def problems(self) -> list[str]:
        p = []
        lost = [o for o in self.outcomes if not o.bad and not o.done and not o.disconnected]
        if lost:
            p.append(f"{len(lost)} request(s) neither completed nor disconnected, e.g. {lost[0]}")
        wrong = [o for o in self.outcomes if o.bad and o.status != 400]
        if wrong:
            p.append(f"{len(wrong)} bad request(s) not answered 400, e.g. {wrong[0]}")
        client_5xx = [o for o in self.outcomes if o.status is not None and o.status >= 500]
        if client_5xx or self.server_5xx:
            p.append(f"5xx responses: {len(client_5xx)} seen by clients, {self.server_5xx:g} counted by the server")
        ok = self.finished.get("stop", 0) + self.finished.get("length", 0)
        if ok < self.completed or self.finished.get("abort", 0) > self.disconnected or self.finished.get("error"):
            p.append(f"server finish counts {self.finished} do not match {self.completed} completed / "
                     f"{self.disconnected} disconnected")
        if self.kv_blocks_used != 0 or self.pending != 0:
            p.append(f"after the round: kv_blocks_used={self.kv_blocks_used:g}, pending={self.pending:g}")
        return p


def _finished(metrics: dict) -> dict:
    pre = M + 'requests_finished_total{finish_reason="'
    return {k[len(pre):-2]: v for k, v in metrics.items() if k.startswith(pre)}


def _5xx(metrics: dict) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(M + "http_responses_total") and 'status="5' in k)


async def run_round(url: str, pid: int, clients: int, disconnect: float, bad: float, max_tokens: int,
                    rng: random.Random, settle_s: float = 30.0) -> Round:
    import httpx  # lazy: a dev extra, needed only when the soak runs

    before = await scrape(url)
    plans = []
    for _ in range(clients):
        x = rng.random()
        if x < bad:
            plans.append(("bad", rng.randrange(len(BAD_BODIES))))
        elif x >= bad + disconnect:
            plans.append(None)
        elif rng.random() < 0.5:
            plans.append(("early", rng.uniform(0.0, 0.3)))
        else:
            plans.append(("chunks", rng.randint(1, max_tokens)))
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    t0 = time.perf_counter()
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0)) as http:
        outcomes = await asyncio.gather(*(one_client(http, url, random.Random(rng.random()), max_tokens, plan)
                                          for plan in plans))
    rnd = Round(clients, time.perf_counter() - t0, list(outcomes))
    deadline = time.monotonic() + settle_s
    while True:  # aborts reach the engine asynchronously: wait until it is idle
        after = await scrape(url)
        rnd.kv_blocks_used = after.get(M + "kv_blocks_used", -1.0)
        rnd.pending = after.get(M + "num_requests_pending", -1.0)
        if (rnd.kv_blocks_used == 0 and rnd.pending == 0) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    fb, fa = _finished(before), _finished(after)
    rnd.finished = {k: fa.get(k, 0) - fb.get(k, 0) for k in fa}
    rnd.server_5xx = _5xx(after) - _5xx(before)
    rnd.rss = rss_bytes(pid)
    return rnd


async def soak(url: str, pid: int, clients: int, rounds: int, disconnect: float, bad: float, max_tokens: int,
               seed: int, report=print) -> list[Round]:
    rng = random.Random(seed)
    out = []
    for i in range(rounds):
        out.append(await run_round(url, pid, clients, disconnect, bad, max_tokens, rng))
        r = out[-1]
        report(f"round {i}: {r.clients} clients in {r.seconds:.1f}s, {r.completed} completed, {r.disconnected} "
               f"disconnected, {r.rejected} bad ones rejected; server finished {r.finished}; kv_blocks_used {r.kv_blocks_used:g}; "
               f"rss {r.rss / 2**20:.1f} MiB" + "".join(f"\n  PROBLEM: {p}" for p in r.problems()))
    return out


def round_record(r: Round) -> dict:
    """One round as the JSON record holds it (the table's columns, unrounded)."""
    return {"clients": r.clients, "seconds": r.seconds, "completed": r.completed, "disconnected": r.disconnected,
            "aborted_in_engine": int(r.finished.get("abort", 0)), "bad_rejected": r.rejected,
            "server_5xx": int(r.server_5xx), "kv_blocks_used_after": r.kv_blocks_used, "pending_after": r.pending,
            "rss_bytes": r.rss, "finished_by_reason": r.finished, "problems": r.problems()}


def rss_growth(rounds: list[Round]) -> float:
    """RSS growth from the second round to the last (the first warms allocators and caches up)."""
    base = rounds[1] if len(rounds) > 2 else rounds[0]
    return rounds[-1].rss / base.rss - 1.0


def start_server(checkpoint: Path, server_args: str, log: Path, timeout: float = 300):
    args = SimpleNamespace(launch=str(checkpoint), server_args=server_args, launch_timeout=timeout)
    proc, base_url = launch_server(args, log)
    url = base_url.removesuffix("/v1")
    asyncio.run(wait_ready(url, "", timeout))
    return proc, url


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=None, help="default: a tiny random model")
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--disconnect", type=float, default=1 / 3, help="share of clients that disconnect")
    p.add_argument("--bad", type=float, default=0.05, help="share of clients that send a bad request")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-args", default="", help="extra `python -m moe.serve` options")
    p.add_argument("--json", default=None, help="also write the rounds, the RSS growth and the problems here")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(a.checkpoint) if a.checkpoint else tiny_checkpoint(Path(tmp))
        proc, url = start_server(ckpt, a.server_args, Path(tmp) / "server.log")
        try:
            rounds = asyncio.run(soak(url, proc.pid, a.clients, a.rounds, a.disconnect, a.bad, a.max_tokens, a.seed))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    rows = [[i, r.clients, f"{r.seconds:.1f}", r.completed, r.disconnected, int(r.finished.get("abort", 0)),
             r.rejected, int(r.server_5xx), int(r.kv_blocks_used), f"{r.rss / 2**20:.1f}"] for i, r in enumerate(rounds)]
    print(markdown_table(["round", "clients", "seconds", "completed", "disconnected", "aborted in the engine",
                          "bad (400)", "5xx", "kv_blocks_used after", "RSS MiB"], rows))
    growth = rss_growth(rounds)
    problems = [f"round {i}: {x}" for i, r in enumerate(rounds) for x in r.problems()]
    if growth > RSS_GROWTH_LIMIT:
        problems.append(f"RSS grew {100 * growth:.1f}% (limit {100 * RSS_GROWTH_LIMIT:.0f}%)")
    print(f"RSS growth from round 1 to the last: {100 * growth:+.1f}%")
    for x in problems:
        print("FAIL:", x)
    if a.json:
        record = {"settings": {k: getattr(a, k) for k in ("checkpoint", "clients", "rounds", "disconnect", "bad",
                                                            "max_tokens", "seed", "server_args")},
                  "rounds": [round_record(r) for r in rounds], "rss_growth": growth, "problems": problems}
        finish_record(record, a.json, [])
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
