"""The server side of a run: the loopback check, launching `python -m moe.serve` on a free port,
waiting for its /health, and its /metrics counters before and after a level."""

from __future__ import annotations

import asyncio
import ipaddress
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

from benchmarks.serving.workload import REPO, api_root
from moe import cli
from moe.errors import UserError

LOOPBACK_NAMES = {"localhost"}
SERVER_COUNTERS = ("moe_serve_engine_steps_total", "moe_serve_engine_model_seconds_total",
                   "moe_serve_num_preemptions_total", "moe_serve_prompt_tokens_total",
                   "moe_serve_generation_tokens_total")


def is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def launch_server(args, log_path: Path) -> tuple[subprocess.Popen, str]:
    """Start `python -m moe.serve args.launch` on a free loopback port; (the process, its base URL)."""
    cmd = [sys.executable, "-m", "moe.serve", args.launch, "--host", "127.0.0.1", "--port", "0",
           "--log-level", "warning", *args.server_args.split()]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True)
    lines: queue.Queue = queue.Queue()

    def pump():  # stdout -> queue (for the port line) and the log
        for line in proc.stdout:
            log.write(line)
            log.flush()
            lines.put(line)
    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + args.launch_timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if line.startswith("moe.serve: listening on "):
            return proc, line.split()[3] + "/v1"
    if proc.poll() == cli.EXIT_USER_ERROR:  # the server refused its arguments (e.g. no checkpoint there)
        log.flush()
        said = [ln for ln in log_path.read_text().splitlines() if ln.startswith("error: ")]
        raise UserError(f"--launch {args.launch}: the server did not start: {said[-1][len('error: '):] if said else ''}"
                        f" (log: {log_path})")
    proc.kill()
    raise SystemExit(f"the server did not start within {args.launch_timeout:.0f} s; see {log_path}")


async def wait_ready(base_url: str, api_key: str, timeout: float) -> None:
    import httpx  # lazy: a dev extra, needed only when a benchmark runs

    root = api_root(base_url)
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=5) as c:
        while True:
            try:
                if (await c.get(root + "/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{root}/health did not answer within {timeout:.0f} s")
            await asyncio.sleep(0.2)


async def scrape(base_url: str) -> dict:
    """The server's /metrics samples ({} when it has none: not a moe.serve server)."""
    import httpx  # lazy: a dev extra, needed only when a benchmark runs

    try:
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.get(api_root(base_url) + "/metrics")
    except httpx.HTTPError:
        return {}
    if r.status_code != 200:
        return {}
    out = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


def server_delta(before: dict, after: dict, duration: float) -> dict:
    """What the server did during a level: steps, model time, preemptions, prefix-cache hit rate."""
    if not before or not after:
        return {}
    d = {k.removeprefix("moe_serve_"): after.get(k, 0) - before.get(k, 0) for k in SERVER_COUNTERS}
    d["model_busy_fraction"] = d["engine_model_seconds_total"] / duration if duration else None
    d["prefix_cache_hit_rate"] = after.get("moe_serve_prefix_cache_hit_rate")
    return d
