"""Per-request plumbing: reading the JSON body, `Generation` (the engine requests, prompts x n
choices, of one HTTP request, and their events), and Server-Sent Events (`sse_stream`: a
generation as OpenAI's chunk stream)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from typing import Any, Callable, Iterable, Optional

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse

from moe.engine import SamplingParams, StreamEvent
from moe.serve.driver import EngineDead
from moe.serve.openai_format import usage
from moe.serve.protocol import APIError, bad_request
from moe.serve.state import ServerState


# ---------------------------------------------------------------------------- helpers
class SSEResponse(StreamingResponse):
    """A StreamingResponse that always watches for the client going away (whatever ASGI spec
    version the server reports), so an abandoned stream is cancelled at once and its
    generator's `finally` aborts the engine request (freeing its KV blocks)."""

    media_type = "text/event-stream"

    async def __call__(self, scope, receive, send) -> None:
        async with anyio.create_task_group() as tg:
            async def run_stream() -> None:
                with contextlib.suppress(OSError):  # servers with ASGI spec 2.4 raise on a dead socket
                    await self.stream_response(send)
                tg.cancel_scope.cancel()

            tg.start_soon(run_stream)
            await self.listen_for_disconnect(receive)
            tg.cancel_scope.cancel()


# Characters JSON leaves raw but `str.splitlines` (and so httpx's `aiter_lines` and many other
# SSE clients) treats as line breaks: generated text containing one would cut a `data:` line in
# two (found by benchmarks/soak.py). Escaped, the JSON is the same value.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse(obj: Any) -> str:
    """One SSE event: `data: <json>` on a single line, whatever the text holds."""
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':')).translate(_LINE_BREAKS)}\n\n"


async def until_disconnect(request: Request) -> None:
    """Returns when the client disconnects (call only after the body was read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# No field of the API nests deeper than a few levels (a chat message's content parts: 4). The limit
# is checked before parsing because Python's json module recurses once per level: a body nested a
# few thousand levels deep raises RecursionError, which would be a 500 instead of a 400.
MAX_JSON_DEPTH = 64
_OPEN, _CLOSE, _QUOTE, _ESCAPE = frozenset(b"[{"), frozenset(b"]}"), ord('"'), ord("\\")


def json_nesting_depth(body: bytes, stop_above: int) -> int:
    """The deepest array/object nesting of a JSON text (brackets inside strings do not count),
    scanning no further than the first point deeper than `stop_above`; a body with too few brackets
    to go deeper returns `stop_above` unscanned. Malformed JSON gets some number; json.loads reports
    it afterwards."""
    if body.count(b"[") + body.count(b"{") <= stop_above:  # C-speed shortcut: every real request
        return stop_above
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == _ESCAPE:
                escaped = True
            elif byte == _QUOTE:
                in_string = False
        elif byte == _QUOTE:
            in_string = True
        elif byte in _OPEN:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > stop_above:
                    break
        elif byte in _CLOSE:
            depth -= 1
    return deepest


async def read_json(request: Request, limit: int) -> dict:
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            size = int(cl)
        except ValueError:
            raise bad_request("bad Content-Length header") from None
        if size > limit:
            raise APIError(413, f"the request body ({size} bytes) exceeds the limit of {limit} bytes",
                           code="request_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise APIError(413, f"the request body exceeds the limit of {limit} bytes", code="request_too_large")
    if not body:
        raise bad_request("the request body is empty (expected a JSON object)")
    depth = json_nesting_depth(bytes(body), MAX_JSON_DEPTH)
    if depth > MAX_JSON_DEPTH:
        raise bad_request(f"the request body nests arrays/objects deeper than {MAX_JSON_DEPTH} levels")
    try:
        data = json.loads(bytes(body))
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"malformed JSON body: {e}") from None
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    return data


# ---------------------------------------------------------------------------- one request's choices
class Generation:
    """The engine requests of one HTTP request (prompts x n choices) and their events."""

    def __init__(self, state: ServerState, prompts: list[list[int]], params: list[list[SamplingParams]]):
        self.state = state
        self.queue: asyncio.Queue = asyncio.Queue()
        self.prompts = prompts
        base = uuid.uuid4().hex
        self.choice: dict[str, int] = {}
        self.jobs: list[tuple[str, list[int], SamplingParams]] = []
        for p, (ids, ps) in enumerate(zip(prompts, params)):
            for j, sp in enumerate(ps):
                idx = p * len(ps) + j
                rid = f"{base}-{idx}"
                self.choice[rid] = idx
                self.jobs.append((rid, ids, sp))
        self.n_choices = len(self.jobs)
        self.done: set[str] = set()
        self.arrival = time.perf_counter()
        self._last_token: dict[str, float] = {}

    def check_capacity(self) -> None:
        driver = self.state.driver
        if not driver.alive:
            raise APIError(503, "the engine is not running", "server_error")
        if driver.num_pending + self.n_choices > self.state.max_pending:
            raise APIError(503, f"the server is overloaded ({driver.num_pending} requests pending); retry later",
                           "server_error", code="overloaded")

    def start(self) -> None:
        """Hand the choices to the engine (for a stream: from inside the response generator, so
        a stream that never starts never adds anything)."""
        driver = self.state.driver
        try:
            for rid, ids, sp in self.jobs:
                driver.add(rid, ids, sp, self.queue)
        except EngineDead as e:
            self.close()
            raise APIError(503, str(e), "server_error") from None
        self.state.metrics.prompt_tokens += sum(len(ids) for ids in self.prompts)

    async def events(self):
        """Yields (choice index, StreamEvent) until every choice finished."""
        m = self.state.metrics
        while len(self.done) < self.n_choices:
            ev = await self.queue.get()
            rid = ev.request_id
            now = time.perf_counter()
            if ev.token_ids:
                last = self._last_token.get(rid)
                if last is None:
                    m.ttft.observe(now - self.arrival)
                else:
                    m.itl.observe((now - last) / len(ev.token_ids))
                self._last_token[rid] = now
            if ev.finished:
                self.done.add(rid)
                if ev.finish_reason in ("stop", "length"):
                    m.e2e.observe(now - self.arrival)
            yield self.choice[rid], ev

    async def collect(self) -> dict:
        outs = {}
        async for idx, ev in self.events():
            if ev.finished:
                outs[idx] = ev.output
        return outs

    def close(self) -> None:
        """Abort what is still running (client gone, error, or cancellation)."""
        for rid in self.choice:
            if rid not in self.done:
                self.state.driver.abort(rid)
                self.done.add(rid)



# ---------------------------------------------------------------------------- OpenAI's chunk stream
def sse_stream(gen: Generation, head: dict, include_usage: bool,
               make_choice: Callable[[int, StreamEvent], Optional[dict]], preamble: Iterable[dict] = ()) -> SSEResponse:
    """Stream a generation as OpenAI SSE chunks: the `preamble` choices, then one chunk per
    engine event (`make_choice(i, event)`; None sends nothing), the usage chunk when asked
    for, and `data: [DONE]`. Closing the stream (a client disconnect) aborts the requests."""
    async def stream():
        extra = {"usage": None} if include_usage else {}
        finals = {}
        try:
            try:
                gen.start()
            except APIError as e:
                yield sse(e.body())
                yield "data: [DONE]\n\n"
                return
            for choice in preamble:
                yield sse({**head, "choices": [choice], **extra})
            async for i, ev in gen.events():
                if ev.finish_reason == "error":
                    yield sse(APIError(500, f"generation failed: {ev.output.error}", "server_error").body())
                    break
                choice = make_choice(i, ev)
                if choice is None:
                    continue
                yield sse({**head, "choices": [choice], **extra})
                if ev.finished:
                    finals[i] = ev.output
            else:
                if include_usage:
                    yield sse({**head, "choices": [],
                               "usage": usage(gen.prompts, [finals[i] for i in range(gen.n_choices)])})
            yield "data: [DONE]\n\n"
        finally:
            gen.close()

    return SSEResponse(stream(), headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
