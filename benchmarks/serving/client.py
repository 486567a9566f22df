"""The load: one streamed request with its timings (`one_request`), and a level of them
(`run_level`: closed loop behind a semaphore, or Poisson arrivals), bounded in time."""

from __future__ import annotations

import asyncio
import math
import random
import time
from typing import Optional

from benchmarks.serving.stats import Result, summarize


async def one_request(client, model: str, prompt: str, args) -> Result:
    """Send `prompt` (as a chat message or a completion prompt, per `args.endpoint`) with
    streaming and usage on, and time its content chunks. Failures are recorded, never raised."""
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


async def send_all(client, model: str, prompts: list[str], args, concurrency: Optional[int], rate: float,
                   seed: int) -> tuple[list[Result], float]:
    """Send every prompt (at most `concurrency` in flight; a finite `rate`: Poisson arrivals);
    returns one Result per prompt (those cut off by `args.level_timeout` count as failed) and
    the start time."""
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
    return results, t0


async def run_level(client, model: str, prompts: list[str], args, concurrency: Optional[int],
                    rate: float = math.inf, seed: int = 0) -> dict:
    """Send `len(prompts)` requests; at most `concurrency` in flight (None: no cap); with a
    finite `rate`, Poisson arrivals at `rate` requests/s. Bounded by `args.level_timeout`.
    Returns the level's summary (`stats.summarize`) with its concurrency and rate."""
    results, t0 = await send_all(client, model, prompts, args, concurrency, rate, seed)
    ends = [r.start + r.e2e for r in results if r.ok]
    duration = (max(ends) if ends else time.perf_counter()) - t0
    out = summarize(results, duration)
    out.update(concurrency=concurrency, request_rate=None if math.isinf(rate) else rate)
    return out
