"""`python -m benchmarks.serving`: the arguments, the run (warm-up, then one level per
concurrency or request rate), and the report files (JSON, Markdown, PNG). With `--sweep`, one
launched server per setting, each run over the same levels, and the throughput-latency
frontier of all of them (frontier.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.serving.client import one_request, run_level
from benchmarks.serving.frontier import frontier_points, frontier_table, plot_frontier, setting_label
from benchmarks.serving.report import level_line, levels_table, plot
from benchmarks.serving.server import is_loopback, launch_server, scrape, server_delta, wait_ready
from benchmarks.serving.sweep import SweepError, launched, parse_sweeps, server_args
from benchmarks.serving.workload import MT_BENCH, filter_prompts, load_prompts
from moe import cli
from moe.errors import UserError

DESCRIPTION = ("Serving benchmark: TTFT, ITL, TPOT, end-to-end latency and throughput of an OpenAI-compatible "
               "server under load, measured with the official `openai` client (streaming), like vLLM's "
               "`benchmark_serving.py`.")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.serving", description=DESCRIPTION)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="a loopback OpenAI-compatible server")
    ap.add_argument("--launch", default=None, metavar="CHECKPOINT",
                    help="start `python -m moe.serve CHECKPOINT` on a free loopback port for the run")
    ap.add_argument("--server-args", default="--max-num-seqs 256",
                    help="extra arguments for the launched server (one string)")
    ap.add_argument("--sweep", action="append", default=[], metavar="NAME=V1,V2,...",
                    help="server settings to compare (repeatable; the cartesian product, each a launched server "
                         "run over the same levels): writes the throughput-latency frontier. Needs --launch")
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
    # lazy: openai and httpx are the dev extra, needed only when a benchmark runs
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
            raise UserError("no prompt fits the server's context with --max-tokens; lower --max-tokens")
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
            print(level_line(lv), flush=True)
    return {"model": model, "prompts": prompt_info, "levels": levels}


def run_sweep(args, settings: list[dict], launch=launched) -> list[dict]:
    """Each setting: a server from `launch(args, setting, log_path)` (a context manager giving
    its base URL), run over the levels; returns [{"setting", "server_args", "model", "levels", ...}]."""
    runs = []
    for i, setting in enumerate(settings):
        print(f"== setting {i + 1}/{len(settings)}: {setting_label(setting)}", flush=True)
        with launch(args, setting, Path(args.out_dir) / f"server-{i}.log") as base_url:
            a = argparse.Namespace(**{**vars(args), "base_url": base_url})
            runs.append({"setting": setting, "server_args": server_args(args.server_args, setting),
                         **asyncio.run(amain(a))})
    return runs


def write_sweep(args, runs: list[dict], out_dir: Path, stem: str) -> dict:
    """The sweep's JSON, its Markdown (frontier, then each setting's levels) and the frontier PNG."""
    points = frontier_points(runs)
    md = "## Throughput-latency frontier\n\n" + frontier_table(points) + "".join(
        f"\n## {setting_label(r['setting'])}\n\n" + levels_table(r["levels"]) for r in runs)
    (out_dir / f"{stem}-frontier.md").write_text(md)
    report = {"config": {k: v for k, v in vars(args).items() if k != "api_key"}, "machine": machine(),
              "runs": runs, "frontier": points}
    (out_dir / f"{stem}-frontier.json").write_text(json.dumps(report, indent=2))
    plot_frontier(points, out_dir / f"{stem}-frontier.png",
                  f"{runs[0]['model']} | {args.endpoint} | max_tokens {args.max_tokens} | P99 latency vs throughput")
    print("\n" + md)
    print(f"wrote {out_dir / stem}-frontier.json / .md / .png")
    return report


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


@cli.guarded
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.endpoint is None:
        args.endpoint = "completions" if args.corpus else "chat"
    out_dir = Path(args.out_dir)
    if args.sweep:
        try:
            settings = parse_sweeps(args.sweep)
        except SweepError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if not args.launch:
            print("error: --sweep needs --launch CHECKPOINT (each setting is a server started with its options)",
                  file=sys.stderr)
            return 2
        out_dir.mkdir(parents=True, exist_ok=True)
        write_sweep(args, run_sweep(args, settings), out_dir, args.tag or "serving-sweep")
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    proc = None
    if args.launch:
        proc, args.base_url = launch_server(args, out_dir / "server.log")
    if not is_loopback(args.base_url):
        raise UserError(f"--base-url {args.base_url} is not a loopback address: this benchmark only drives local "
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
              "machine": machine(), **res}
    stem = args.tag or f"serving-{res['model']}"
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=2))
    table = levels_table(res["levels"])
    (out_dir / f"{stem}.md").write_text(table)
    plot(res["levels"], out_dir / f"{stem}.png",
         f"{res['model']} | {args.endpoint} | max_tokens {args.max_tokens}{' (ignore_eos)' if args.ignore_eos else ''}")
    print("\n" + table)
    print(f"wrote {out_dir / stem}.json / .md / .png")
    return 0
