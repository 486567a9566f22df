"""Prometheus text-format metrics for `/metrics` (no client library needed).

Gauges come from `LLM.stats()` (read on the engine thread when scraped); counters and the
latency histograms are kept on the event loop as requests come and go.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter, deque
from typing import Iterable

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
PREFIX = "moe_serve"


class Histogram:
    def __init__(self, buckets: Iterable[float]):
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.sum += v
        self.count += 1

    def render(self, name: str, help_: str) -> list[str]:
        lines = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        acc = 0
        for b, c in zip((*self.buckets, float("inf")), self.counts):
            acc += c
            le = "+Inf" if b == float("inf") else repr(b)
            lines.append(f'{name}_bucket{{le="{le}"}} {acc}')
        lines += [f"{name}_sum {self.sum}", f"{name}_count {self.count}"]
        return lines


class ServerMetrics:
    def __init__(self, window_s: float = 10.0):
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.finished = Counter()  # engine finish reasons (abort = client gone)
        self.http = Counter()  # (endpoint, status)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.window_s = window_s
        self._recent: deque = deque()  # (time, tokens) of the last window_s seconds
        self.started = time.time()

    def on_events(self, events) -> None:
        now = time.perf_counter()
        n = 0
        for ev in events:
            n += len(ev.token_ids)
            if ev.finished:
                self.finished[ev.finish_reason or "unknown"] += 1
        if n:
            self.generation_tokens += n
            self._recent.append((now, n))
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - self.window_s:
            self._recent.popleft()

    def tokens_per_s(self) -> float:
        now = time.perf_counter()
        self._trim(now)
        return sum(n for _, n in self._recent) / self.window_s

    def render(self, stats: dict, num_pending: int, ranks: list[dict] | None = None) -> str:
        p = PREFIX
        lines: list[str] = []

        def metric(name, kind, help_, value, labels=""):
            lines.extend([f"# HELP {p}_{name} {help_}", f"# TYPE {p}_{name} {kind}", f"{p}_{name}{labels} {value}"])

        metric("num_requests_running", "gauge", "Sequences in the engine's running batch.", stats.get("num_running", 0))
        metric("num_requests_waiting", "gauge", "Sequences waiting for admission.", stats.get("num_waiting", 0))
        metric("num_requests_pending", "gauge", "Requests accepted and not finished (server side).", num_pending)
        metric("kv_cache_usage_ratio", "gauge", "Fraction of KV blocks in use.", stats.get("kv_cache_usage", 0.0))
        metric("kv_blocks_used", "gauge", "KV blocks in use.", stats.get("kv_blocks_used", 0))
        metric("kv_blocks_total", "gauge", "KV blocks in the cache.", stats.get("kv_blocks_total", 0))
        metric("prefix_cache_hit_rate", "gauge", "Prompt tokens served from the prefix cache / looked up.",
               stats.get("prefix_cache_hit_rate", 0.0))
        metric("num_preemptions_total", "counter", "Sequences preempted (recomputed later).",
               stats.get("num_preemptions", 0))
        metric("engine_steps_total", "counter", "Engine steps run.", stats.get("num_steps", 0))
        metric("engine_model_seconds_total", "counter", "Seconds spent in model forwards.",
               round(stats.get("model_time_s", 0.0), 6))
        metric("prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", self.prompt_tokens)
        metric("generation_tokens_total", "counter", "Tokens generated.", self.generation_tokens)
        metric("generation_tokens_per_second", "gauge", f"Tokens generated per second over the last "
               f"{self.window_s:g} s.", round(self.tokens_per_s(), 3))
        routing = sorted((k, v) for k, v in stats.items() if k.startswith("moe/") and isinstance(v, (int, float))
                         and not isinstance(v, bool))
        if routing:  # the engine's routing statistics of all tokens served (training's `moe/...` keys)
            lines += [f"# HELP {p}_routing Routing statistics of the tokens served so far, by key.",
                      f"# TYPE {p}_routing gauge"]
            lines += [f'{p}_routing{{key="{k}"}} {v}' for k, v in routing]
        spec_help = {"spec_steps": ("counter", "Verification steps with speculative proposals."),
                     "spec_proposed": ("counter", "Speculative tokens proposed."),
                     "spec_accepted": ("counter", "Speculative tokens accepted by the served model."),
                     "spec_emitted": ("counter", "Tokens emitted by verification steps."),
                     "spec_acceptance_rate": ("gauge", "Accepted / proposed speculative tokens."),
                     "spec_mean_accepted_length": ("gauge", "Speculative tokens accepted per verification step.")}
        for key, (kind, help_) in spec_help.items():
            if key in stats:
                metric(key + ("_total" if kind == "counter" else ""), kind, help_, stats[key])
        lines += _expert_cache_lines(p, stats)
        lines += _rank_lines(p, ranks or [])
        lines += [f"# HELP {p}_requests_finished_total Engine requests finished, by finish reason.",
                  f"# TYPE {p}_requests_finished_total counter"]
        for reason in sorted(set(self.finished) | {"stop", "length", "abort", "error"}):
            lines.append(f'{p}_requests_finished_total{{finish_reason="{reason}"}} {self.finished[reason]}')
        lines += [f"# HELP {p}_http_responses_total HTTP responses by endpoint and status.",
                  f"# TYPE {p}_http_responses_total counter"]
        for (endpoint, status), c in sorted(self.http.items()):
            lines.append(f'{p}_http_responses_total{{endpoint="{endpoint}",status="{status}"}} {c}')
        lines += self.ttft.render(f"{p}_time_to_first_token_seconds", "Time from request arrival to its first token.")
        lines += self.itl.render(f"{p}_inter_token_latency_seconds", "Time between a request's successive tokens.")
        lines += self.e2e.render(f"{p}_e2e_request_latency_seconds", "Time from request arrival to its last token.")
        return "\n".join(lines) + "\n"


def _expert_cache_lines(p: str, stats: dict) -> list[str]:
    """With `expert_cache=` (moe/engine/offload/): its `offload/...` statistics, and each MoE layer's hit rate."""
    keys = sorted((k[len("offload/"):], v) for k, v in stats.items() if k.startswith("offload/")
                  and isinstance(v, (int, float)) and not isinstance(v, bool))
    if not keys:
        return []
    lines = [f"# HELP {p}_expert_cache Expert cache statistics since the engine started (hit_rate, "
             "prefetch_precision, prefetch_recall, bytes_per_token, stall_s, ...), by key.",
             f"# TYPE {p}_expert_cache gauge"]
    lines += [f'{p}_expert_cache{{key="{k}"}} {v}' for k, v in keys]
    lines += [f"# HELP {p}_expert_cache_layer_hit_rate Expert cache hit rate of each MoE layer.",
              f"# TYPE {p}_expert_cache_layer_hit_rate gauge"]
    lines += [f'{p}_expert_cache_layer_hit_rate{{layer="{layer}"}} {s["hit_rate"]}'
              for layer, s in stats.get("offload/layers", {}).items()]
    return lines


RANK_SERIES = (  # (rank_stats key, metric name, kind, help): a tensor-parallel engine's per-rank figures
    ("steps", "rank_steps_total", "counter", "Model forwards this rank ran (every rank runs every step)."),
    ("forward_s", "rank_forward_seconds_total", "counter", "Seconds this rank spent in model forwards."),
    ("comm_s", "rank_comm_seconds_total", "counter", "Seconds of those this rank spent in collectives."),
    ("kv_blocks_total", "rank_kv_blocks_total", "gauge", "KV blocks in this rank's cache shard (the block ids "
     "are rank 0's: moe_serve_kv_blocks_used counts the blocks used on every rank)."),
    ("kv_cache_bytes", "rank_kv_cache_bytes", "gauge", "Bytes of this rank's KV cache shard."),
    ("max_rss_bytes", "rank_max_rss_bytes", "gauge", "Peak resident host memory of this rank's process."),
)


def _rank_lines(p: str, ranks: list[dict]) -> list[str]:
    """With tensor_parallel_size > 1: each rank's series, labelled rank="i" (the engine-wide
    series above are rank 0's scheduler's, which serve every rank)."""
    if not ranks:
        return []
    lines = [f"# HELP {p}_rank_info A rank of the tensor-parallel engine and its process id.",
             f"# TYPE {p}_rank_info gauge"]
    lines += [f'{p}_rank_info{{rank="{r["rank"]}",pid="{r["pid"]}"}} 1' for r in ranks]
    for key, name, kind, help_ in RANK_SERIES:
        lines += [f"# HELP {p}_{name} {help_}", f"# TYPE {p}_{name} {kind}"]
        lines += [f'{p}_{name}{{rank="{r["rank"]}"}} {round(r[key], 6)}' for r in ranks]
    return lines
