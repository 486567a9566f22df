"""Serving benchmark: TTFT, ITL, TPOT, end-to-end latency and throughput of an OpenAI-compatible
server under load, measured with the official `openai` client (streaming), like vLLM's
`benchmark_serving.py`.

    python -m moe.serve runs/x --port 8000 --max-num-seqs 256 &
    python -m benchmarks.serving --base-url http://127.0.0.1:8000/v1            # 1, 50, 100, 200
    python -m benchmarks.serving --launch runs/x --concurrency 1,8,32            # starts the server itself
    python -m benchmarks.serving --launch runs/x --request-rate 2,8 --num-prompts 64   # Poisson arrivals
    python -m benchmarks.serving --launch runs/x --concurrency 8,64 \
        --sweep 'max_num_seqs=32,64,128,256' --sweep 'max_num_batched_tokens=512,2048'   # the frontier

Each level sends `--num-prompts` requests (default: 2 x the concurrency, at least 10), either
all at once behind a semaphore of `--concurrency` requests in flight (closed loop), or with
Poisson inter-arrival times at `--request-rate` requests/s (open loop, optionally capped by
`--max-concurrency`). Prompts are MT-Bench first turns (`../shared/data/mt_bench/question.jsonl`
from the repo root) sent as chat completions, or chunks of a text file (`--corpus`) sent as
completions; prompts that would not fit the context with `--max-tokens` are left out (the
server's `/tokenize` says how long they are). Per level: success rate, request and output
token throughput, and mean / median / P99 of TTFT (to the first content chunk), ITL (between
content chunks), TPOT ((e2e - ttft) / (output tokens - 1)) and end-to-end latency. Results go to
`--out-dir` as JSON, a Markdown table and a PNG. Only loopback servers are accepted. With
`--sweep NAME=V1,V2,...` (repeatable), each server setting of the cartesian product is launched
and run over the same levels, and the throughput-latency frontier (output tok/s against P99 TTFT
and P99 ITL, Pareto-optimal points marked) is written as `<tag>-frontier.md/.json/.png`.

Modules: workload (prompts, and which fit the server's context), client (one streamed request
and its timings; a level of them), stats (percentiles, a level's summary), server (launching a
server, its health and /metrics, the loopback check), report (Markdown table, plot), sweep
(--sweep settings, their server arguments and launches), frontier (Pareto marking, table,
plot), cli.
"""

from benchmarks.serving.cli import build_parser, main, run_sweep, write_sweep
from benchmarks.serving.frontier import frontier_points, frontier_table, pareto, plot_frontier
from benchmarks.serving.client import Result, one_request, run_level
from benchmarks.serving.report import level_label, levels_table, plot
from benchmarks.serving.server import is_loopback, launch_server, scrape, server_delta, wait_ready
from benchmarks.serving.stats import pct, stats, summarize
from benchmarks.serving.sweep import SweepError, parse_sweeps, server_args
from benchmarks.serving.workload import filter_prompts, load_prompts

__all__ = ["build_parser", "main", "run_sweep", "write_sweep", "frontier_points", "frontier_table", "pareto",
           "plot_frontier", "SweepError", "parse_sweeps", "server_args", "Result", "one_request", "run_level", "level_label", "levels_table", "plot",
           "is_loopback", "launch_server", "scrape", "server_delta", "wait_ready", "pct", "stats", "summarize",
           "filter_prompts", "load_prompts"]
