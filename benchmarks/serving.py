"""Serving benchmark: TTFT, ITL, TPOT, end-to-end latency and throughput of an OpenAI-compatible
server under load, measured with the official `openai` client (streaming), like vLLM's
`benchmark_serving.py`.

    python -m moe.serve runs/x --port 8000 --max-num-seqs 256 &
    python benchmarks/serving.py --base-url http://127.0.0.1:8000/v1            # 1, 50, 100, 200
    python benchmarks/serving.py --launch runs/x --concurrency 1,8,32            # starts the server itself
    python benchmarks/serving.py --launch runs/x --request-rate 2,8 --num-prompts 64   # Poisson arrivals

Each level sends `--num-prompts` requests (default: 2 x the concurrency, at least 10), either
all at once behind a semaphore of `--concurrency` requests in flight (closed loop), or with
Poisson inter-arrival times at `--request-rate` requests/s (open loop, optionally capped by
`--max-concurrency`). Prompts are MT-Bench first turns (`../shared/data/mt_bench/question.jsonl`
from the repo root) sent as chat completions, or chunks of a text file (`--corpus`) sent as
completions; prompts that would not fit the context with `--max-tokens` are left out (the
server's `/tokenize` says how long they are). Per level: success rate, request and output
token throughput, and mean / median / P99 of TTFT (to the first content chunk), ITL (between
content chunks), TPOT ((e2e - ttft) / (output tokens - 1)) and end-to-end latency. Results go to
`--out-dir` as JSON, a Markdown table and a PNG. Only loopback servers are accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import ipaddress
import json
import math
import os
import platform
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
MT_BENCH = REPO.parent / "shared" / "data" / "mt_bench" / "question.jsonl"
LOOPBACK_NAMES = {"localhost"}


# ---------------------------------------------------------------------------- prompts
def load_prompts(args) -> list[str]:
    if args.corpus:
        text = Path(args.corpus).read_text(encoding="utf-8", errors="replace")
        paras = [p.strip() for p in text.split("\n\n") if p.strip()]
        chunks, buf = [], ""
        for p in paras:  # paragraphs packed into chunks of about --corpus-chars characters
            buf = f"{buf}\n\n{p}" if buf else p
            if len(buf) >= args.corpus_chars:
                chunks.append(buf[: args.corpus_chars])
                buf = ""
            if len(chunks) >= 10_000:
                break
        return chunks or [text[: args.corpus_chars]]
    path = Path(args.dataset)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows if r.get("turns")]


def is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------------- one request
@dataclasses.dataclass
class Result:
    ok: bool = False
    error: Optional[str] = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: Optional[float] = None  # s, to the first chunk with content
    itl: list = dataclasses.field(default_factory=list)  # s, between content chunks
    e2e: Optional[float] = None
    start: float = 0.0


async def one_request(client, model: str, prompt: str, args) -> Result:
    res = Result(start=time.perf_counter())
    extra = {"ignore_eos": True} if args.ignore_eos else None
    kw = dict(model=model, max_tokens=args.max_tokens, temperature=args.temperature, stream=True,
              stream_options={"include_usage": True}, extra_body=extra, timeout=args.request_timeout)
    if args.seed is not None:
        kw["seed"] = args.seed
    t0 = res.start
    last = None
    try:
        if args.endpoint == "chat":
            stream = await client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **kw)
        else:
            stream = await client.completions.create(prompt=prompt, **kw)
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices:
                c = chunk.choices[0]
                text = c.delta.content if args.endpoint == "chat" else c.text
                if text:
                    if res.ttft is None:
                        res.ttft = now - t0
                    else:
                        res.itl.append(now - last)
                    last = now
            if getattr(chunk, "usage", None):
                res.prompt_tokens = chunk.usage.prompt_tokens
                res.output_tokens = chunk.usage.completion_tokens
        res.e2e = time.perf_counter() - t0
        res.ok = True
    except asyncio.CancelledError:
        res.error = "cancelled (level timeout)"
    except Exception as e:  # counted as a failure, never fatal
        res.error = f"{type(e).__name__}: {str(e)[:200]}"
    return res


# ---------------------------------------------------------------------------- one level
def pct(xs, q) -> Optional[float]:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def stats(xs, scale: float = 1.0) -> dict:
    xs = [x * scale for x in xs if x is not None]
    return {"mean": sum(xs) / len(xs) if xs else None, "median": pct(xs, 50), "p99": pct(xs, 99), "n": len(xs)}


def summarize(results: list[Result], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok
            if r.ttft is not None and r.output_tokens > 1]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error] = errors.get(r.error, 0) + 1
    return {
        "num_requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "success_rate": len(ok) / len(results) if results else 0.0, "duration_s": duration,
        "total_prompt_tokens": sum(r.prompt_tokens for r in ok), "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_throughput": out_tokens / duration if duration else 0.0,
        "total_token_throughput": (out_tokens + sum(r.prompt_tokens for r in ok)) / duration if duration else 0.0,
        "ttft_ms": stats([r.ttft for r in ok], 1e3),
        "itl_ms": stats([x for r in ok for x in r.itl], 1e3),
        "tpot_ms": stats(tpot, 1e3),
        "e2e_s": stats([r.e2e for r in ok]),
        "errors": errors,
    }


async def run_level(client, model: str, prompts: list[str], args, concurrency: Optional[int],
                    rate: float = math.inf, seed: int = 0) -> dict:
    """Send `len(prompts)` requests; at most `concurrency` in flight (None: no cap); with a
    finite `rate`, Poisson arrivals at `rate` requests/s. Bounded by `args.level_timeout`."""
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    rng = random.Random(seed)

    async def limited(p):
        if sem is None:
            return await one_request(client, model, p, args)
        async with sem:
            return await one_request(client, model, p, args)

    t0 = time.perf_counter()
    tasks = []

    async def launch():
        for p in prompts:
            tasks.append(asyncio.ensure_future(limited(p)))
            if math.isfinite(rate):
                await asyncio.sleep(rng.expovariate(rate))

    launcher = asyncio.ensure_future(launch())
    deadline = t0 + args.level_timeout
    await asyncio.wait({launcher}, timeout=args.level_timeout)
    if not launcher.done():
        launcher.cancel()
    pending = [t for t in tasks if not t.done()]
    if pending:
        await asyncio.wait(pending, timeout=max(0.0, deadline - time.perf_counter()))
    for t in tasks:
        if not t.done():
            t.cancel()
    results = []
    for t in tasks:
        try:
            results.append(await t)
        except asyncio.CancelledError:
            results.append(Result(error="cancelled (level timeout)"))
    results += [Result(error="not sent (level timeout)") for _ in range(len(prompts) - len(tasks))]
    ends = [r.start + r.e2e for r in results if r.ok]
    duration = (max(ends) if ends else time.perf_counter()) - t0
    out = summarize(results, duration)
    out.update(concurrency=concurrency, request_rate=None if math.isinf(rate) else rate)
    return out


# ---------------------------------------------------------------------------- reports
def _fmt(v, nd=1):
    return "-" if v is None else f"{v:.{nd}f}"


def _tri(s: dict, nd=1) -> str:
    return f"{_fmt(s['mean'], nd)} / {_fmt(s['median'], nd)} / {_fmt(s['p99'], nd)}"


def level_label(lv: dict) -> str:
    if lv.get("request_rate") is not None:
        cap = f", max {lv['concurrency']}" if lv.get("concurrency") else ""
        return f"{lv['request_rate']:g} req/s{cap}"
    return str(lv["concurrency"])


def markdown_table(levels: list[dict]) -> str:
    head = ("| Concurrency | OK / sent | Req/s | Out tok/s | TTFT ms (mean / med / P99) | ITL ms (mean / med / P99) "
            "| TPOT ms (mean / med / P99) | E2E s (mean / med / P99) |")
    rows = [head, "|" + "---|" * 8]
    for lv in levels:
        rows.append(f"| {level_label(lv)} | {lv['completed']} / {lv['num_requests']} ({lv['success_rate']:.0%}) "
                    f"| {lv['request_throughput']:.2f} | {lv['output_throughput']:.1f} | {_tri(lv['ttft_ms'])} "
                    f"| {_tri(lv['itl_ms'])} | {_tri(lv['tpot_ms'])} | {_tri(lv['e2e_s'], 2)} |")
    return "\n".join(rows) + "\n"


def plot(levels: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [level_label(lv) for lv in levels]
    x = range(len(levels))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, name in ((axes[0], "ttft_ms", "TTFT (ms)"), (axes[1], "itl_ms", "ITL (ms)")):
        for stat, style in (("median", "o-"), ("p99", "s--"), ("mean", "^:")):
            ax.plot(x, [lv[key][stat] if lv[key][stat] is not None else float("nan") for lv in levels], style,
                    label=stat)
        ax.set_title(name)
        ax.set_yscale("log")
    ax = axes[2]
    ax.bar(x, [lv["output_throughput"] for lv in levels], color="tab:green", alpha=0.7, label="output tok/s")
    ax.set_title("Output throughput (tok/s)")
    ax2 = ax.twinx()
    ax2.plot(x, [lv["request_throughput"] for lv in levels], "ko-", label="req/s")
    ax2.set_ylabel("req/s")
    for a in axes:
        a.set_xticks(list(x))
        a.set_xticklabels(labels)
        a.set_xlabel("concurrency" if levels and levels[0].get("request_rate") is None else "request rate")
        a.grid(alpha=0.3)
    axes[0].legend()
    axes[1].legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------- the server
def launch_server(args, log_path: Path) -> tuple[subprocess.Popen, str]:
    import queue

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
    proc.kill()
    raise SystemExit(f"the server did not start within {args.launch_timeout:.0f} s; see {log_path}")


async def wait_ready(base_url: str, api_key: str, timeout: float) -> None:
    import httpx
    root = base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url
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


SERVER_COUNTERS = ("moe_serve_engine_steps_total", "moe_serve_engine_model_seconds_total",
                   "moe_serve_num_preemptions_total", "moe_serve_prompt_tokens_total",
                   "moe_serve_generation_tokens_total")


async def scrape(base_url: str) -> dict:
    """The server's /metrics samples ({} when it has none: not a moe.serve server)."""
    import httpx
    root = base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url
    try:
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.get(root + "/metrics")
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


async def filter_prompts(base_url: str, api_key: str, model: str, prompts: list[str], args) -> tuple[list[str], dict]:
    """Keep prompts whose tokens + max_tokens fit the server's context (via its /tokenize)."""
    import httpx
    root = base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url
    kept, lens, info = [], [], {}
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {api_key}"}) as c:
        for p in prompts:
            body = {"model": model, "messages": [{"role": "user", "content": p}]} if args.endpoint == "chat" \
                else {"model": model, "prompt": p}
            r = await c.post(root + "/tokenize", json=body)
            if r.status_code != 200:
                return prompts, {"note": f"no /tokenize ({r.status_code}): prompts not filtered"}
            d = r.json()
            if d["count"] + args.max_tokens <= d["max_model_len"]:
                kept.append(p)
                lens.append(d["count"])
            info["max_model_len"] = d["max_model_len"]
    info.update(prompts_available=len(prompts), prompts_fitting=len(kept),
                prompt_tokens_mean=sum(lens) / len(lens) if lens else None,
                prompt_tokens_max=max(lens) if lens else None)
    return kept, info


# ---------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="a loopback OpenAI-compatible server")
    ap.add_argument("--launch", default=None, metavar="CHECKPOINT",
                    help="start `python -m moe.serve CHECKPOINT` on a free loopback port for the run")
    ap.add_argument("--server-args", default="--max-num-seqs 256",
                    help="extra arguments for the launched server (one string)")
    ap.add_argument("--launch-timeout", type=float, default=300)
    ap.add_argument("--api-key", default=os.environ.get("MOE_SERVE_API_KEY", "none"))
    ap.add_argument("--model", default=None, help="default: the server's first model")
    ap.add_argument("--endpoint", choices=["chat", "completions"], default=None,
                    help="default: chat for MT-Bench, completions for --corpus")
    ap.add_argument("--dataset", default=str(MT_BENCH), help="MT-Bench question.jsonl (first turns are the prompts)")
    ap.add_argument("--corpus", default=None, help="a text file to cut prompts from, instead of MT-Bench")
    ap.add_argument("--corpus-chars", type=int, default=400)
    ap.add_argument("--concurrency", default="1,50,100,200", help="comma-separated levels (closed loop)")
    ap.add_argument("--request-rate", default=None,
                    help="comma-separated Poisson request rates (req/s); replaces --concurrency levels")
    ap.add_argument("--max-concurrency", type=int, default=None, help="cap in flight with --request-rate")
    ap.add_argument("--num-prompts", type=int, default=None, help="per level (default: max(2 x concurrency, 10))")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None, help="sampling seed sent with each request")
    ap.add_argument("--ignore-eos", action="store_true", help="every request generates --max-tokens tokens")
    ap.add_argument("--warmup", type=int, default=2, help="requests sent (not measured) before the levels")
    ap.add_argument("--request-timeout", type=float, default=600)
    ap.add_argument("--level-timeout", type=float, default=900, help="a level's requests still running after "
                    "this are cancelled and counted as failed")
    ap.add_argument("--shuffle-seed", type=int, default=0)
    ap.add_argument("--out-dir", default="outputs/benchmarks/serving")
    ap.add_argument("--tag", default=None, help="file name stem (default: serving-<model>)")
    return ap


async def amain(args) -> dict:
    import httpx
    from openai import AsyncOpenAI

    await wait_ready(args.base_url, args.api_key, 60)
    # Expire idle connections well before the server does (uvicorn: 5 s by default, 15 s for
    # moe.serve), or a request may go out on a connection the server is closing at that moment.
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=500, keepalive_expiry=2.0)
    async with AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0,
                           http_client=httpx.AsyncClient(limits=limits, timeout=args.request_timeout)) as client:
        models = await client.models.list()
        model = args.model or models.data[0].id
        prompts, prompt_info = await filter_prompts(args.base_url, args.api_key, model, load_prompts(args), args)
        if not prompts:
            raise SystemExit("no prompt fits the server's context with --max-tokens")
        random.Random(args.shuffle_seed).shuffle(prompts)
        if args.warmup:
            await asyncio.gather(*(one_request(client, model, prompts[i % len(prompts)], args)
                                   for i in range(args.warmup)))
        if args.request_rate:
            plan = [(args.max_concurrency, float(r)) for r in args.request_rate.split(",")]
        else:
            plan = [(int(c), math.inf) for c in args.concurrency.split(",")]
        levels = []
        for k, (conc, rate) in enumerate(plan):
            n = args.num_prompts or max(2 * (conc or 1), 10)
            level_prompts = [prompts[i % len(prompts)] for i in range(k * 7, k * 7 + n)]  # vary the order a bit
            before = await scrape(args.base_url)
            lv = await run_level(client, model, level_prompts, args, conc, rate, seed=args.shuffle_seed + k)
            lv["server"] = server_delta(before, await scrape(args.base_url), lv["duration_s"])
            levels.append(lv)
            print(f"[{level_label(lv)}] {lv['completed']}/{lv['num_requests']} ok in {lv['duration_s']:.1f} s | "
                  f"{lv['output_throughput']:.1f} out tok/s | TTFT p50 {_fmt(lv['ttft_ms']['median'])} ms "
                  f"p99 {_fmt(lv['ttft_ms']['p99'])} ms | ITL p50 {_fmt(lv['itl_ms']['median'])} ms "
                  f"p99 {_fmt(lv['itl_ms']['p99'])} ms", flush=True)
    return {"model": model, "prompts": prompt_info, "levels": levels}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.endpoint is None:
        args.endpoint = "completions" if args.corpus else "chat"
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    proc = None
    if args.launch:
        proc, args.base_url = launch_server(args, out_dir / "server.log")
    if not is_loopback(args.base_url):
        raise SystemExit(f"--base-url {args.base_url} is not a loopback address: this benchmark only drives local "
                         "servers")
    try:
        t0 = time.time()
        res = asyncio.run(amain(args))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    cfg = {k: v for k, v in vars(args).items() if k not in ("api_key",)}
    report = {"config": cfg, "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0)),
              "machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "cpus": os.cpu_count(),
                          "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
              **res}
    stem = args.tag or f"serving-{res['model']}"
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=2))
    table = markdown_table(res["levels"])
    (out_dir / f"{stem}.md").write_text(table)
    plot(res["levels"], out_dir / f"{stem}.png",
         f"{res['model']} | {args.endpoint} | max_tokens {args.max_tokens}{' (ignore_eos)' if args.ignore_eos else ''}")
    print("\n" + table)
    print(f"wrote {out_dir / stem}.json / .md / .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
