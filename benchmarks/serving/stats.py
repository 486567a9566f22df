"""What one request measured (`Result`, filled in by the client) and the statistics of a level:
percentiles and the summary (success rate, throughputs, latencies)."""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np


@dataclasses.dataclass
class Result:
    """One request's measurements (times in seconds)."""

    ok: bool = False
    error: Optional[str] = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: Optional[float] = None  # s, to the first chunk with content
    itl: list = dataclasses.field(default_factory=list)  # s, between content chunks
    e2e: Optional[float] = None
    start: float = 0.0


def pct(xs, q) -> Optional[float]:
    """The q-th percentile (linear interpolation between closest ranks), None for no data."""
    return float(np.percentile(xs, q)) if len(xs) else None


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
