"""`EngineDriver`: the synchronous `LLM` behind one driver thread, for an asyncio server.

Why a thread and not `asyncio.to_thread(llm.step)`: the engine is not thread-safe, so every
touch of it (add, abort, step, stats) must be serialized. With one dedicated driver thread
that owns the `LLM`, the event loop never touches the engine (but for `validate_request`, which
reads only settings fixed at construction): it posts commands (a deque + an Event to wake the
driver) and the driver applies them between steps, steps while there is work, sleeps on the
Event when there is none, and hands each step's `StreamEvent`s back to the loop in one
`loop.call_soon_threadsafe` call, which routes them to per-request `asyncio.Queue`s. The model forward (torch releases the GIL) thus overlaps HTTP work, and the
loop stays responsive while a step runs. (With `to_thread`, adds and aborts arriving during a
step would need the same queueing anyway.)

An abort (client gone) unregisters the request's queue at once and reaches the engine before
its next step, which frees the request's KV blocks.

A tensor-parallel engine (`tensor_parallel_size > 1`) can fail for good: a rank died. The driver
asks its runner after every step, and every `HEALTH_POLL_S` while idle, so that a rank dying
between requests is noticed too; then it fails every live request with the rank's error, calls
`on_fatal(message)` on the loop (`python -m moe.serve` shuts down and exits non-zero) and stops.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Optional

from moe.engine import RequestOutput, SamplingParams, StreamEvent

logger = logging.getLogger(__name__)
HEALTH_POLL_S = 0.5  # how often an idle driver checks that a tensor-parallel engine's ranks are alive


class EngineDead(RuntimeError):
    """The driver thread is not running (not started yet, stopped, or crashed)."""


class EngineDriver:
    def __init__(self, llm, on_events: Optional[Callable[[list[StreamEvent]], None]] = None,
                 on_fatal: Optional[Callable[[str], None]] = None):
        self.llm = llm
        self.on_events = on_events  # called on the loop with every step's events (metrics)
        self.on_fatal = on_fatal  # called on the loop once the engine cannot continue (a rank died)
        self.fatal: Optional[str] = None  # why, once it happened
        # a tensor-parallel engine's runner says whether its ranks are alive (moe/engine/parallel/runner.py)
        self._check_ranks = getattr(getattr(llm, "runner", None), "check_ranks", None)
        self._cmds: deque = deque()  # (op, ...) posted by the loop, applied by the driver
        self._wake = threading.Event()
        self._queues: dict[str, asyncio.Queue] = {}  # loop side only: live request id -> its queue
        self._live: set[str] = set()  # driver side only: ids added to the engine, not yet finished
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._stop = False
        self.steps = 0

    # ------------------------------------------------------------------ loop side
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="moe-serve-engine", daemon=True)
        self._thread.start()

    async def stop(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def num_pending(self) -> int:
        """Requests added and not yet finished (as the loop sees them)."""
        return len(self._queues)

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
            queue: asyncio.Queue) -> None:
        if not self.alive:
            raise EngineDead("the engine driver is not running")
        self._queues[request_id] = queue
        self._post(("add", request_id, prompt_token_ids, params))

    def abort(self, request_id: str) -> None:
        """Stop a request (no more events reach its queue); a no-op once it finished."""
        if self._queues.pop(request_id, None) is not None:
            self._post(("abort", request_id))

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """Run `fn(llm)` on the driver thread between steps (e.g. `lambda llm: llm.stats()`)."""
        if not self.alive or self.fatal is not None:
            raise EngineDead("the engine driver is not running")
        fut = self._loop.create_future()
        self._post(("call", fn, fut))
        return await fut

    def _post(self, cmd) -> None:
        self._cmds.append(cmd)
        self._wake.set()

    def _dispatch(self, events: list[StreamEvent]) -> None:
        for ev in events:
            q = self._queues.get(ev.request_id)
            if ev.finished:
                self._queues.pop(ev.request_id, None)
            if q is not None:
                q.put_nowait(ev)
        if self.on_events is not None:
            try:
                self.on_events(events)
            except Exception:  # metrics must never break serving
                logger.exception("on_events hook failed")

    @staticmethod
    def _resolve(fut: asyncio.Future, value=None, exc: Optional[BaseException] = None) -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)

    # ------------------------------------------------------------------ driver thread
    def _to_loop(self, fn, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: the server is going away
            pass

    def _apply(self, cmd) -> list[StreamEvent]:
        """Apply one command; returns events to report at once (a failed add)."""
        op = cmd[0]
        if op == "add":
            _, rid, ids, params = cmd
            try:
                self.llm.add_request(ids, params, request_id=rid)
                self._live.add(rid)
            except Exception as e:  # e.g. a duplicate id: fail this request only
                logger.exception("add_request failed")
                return [_error_event(rid, f"{type(e).__name__}: {e}")]
        elif op == "abort":
            _, rid = cmd
            if rid in self._live:
                self.llm.abort_request(rid)
        elif op == "call":
            _, fn, fut = cmd
            try:
                value, exc = fn(self.llm), None
            except Exception as e:
                value, exc = None, e
            self._to_loop(self._resolve, fut, value, exc)
        return []

    def _run(self) -> None:
        idle_spins = 0
        while True:
            self._wake.clear()
            events: list[StreamEvent] = []
            while self._cmds:
                events += self._apply(self._cmds.popleft())
            if self._stop:
                for rid in list(self._live):
                    self.llm.abort_request(rid)
                self.llm.finish_profile()  # (--profile-steps) on the thread that started the profiler
                break
            if self._live:
                try:
                    step_events = self.llm.step()
                    self.steps += 1
                except Exception as e:  # a bug, not a model error (step() catches those): fail all, go on
                    logger.exception("engine step failed")
                    step_events = self._fail_all(f"engine step failed: {type(e).__name__}: {e}")
                for ev in step_events:
                    if ev.finished:
                        self._live.discard(ev.request_id)
                events += step_events
                # Nothing came out and the scheduler holds nothing: never spin hot.
                if not step_events and self.llm.is_idle():
                    idle_spins += 1
                    if idle_spins > 100:
                        time.sleep(0.01)
                else:
                    idle_spins = 0
            failure = self._check_ranks() if self._check_ranks is not None else None
            if failure is not None:
                self._die(events, failure)
                break
            if events:
                self._to_loop(self._dispatch, events)
            if not self._live and not self._cmds:
                self._wake.wait(HEALTH_POLL_S if self._check_ranks is not None else None)

    def _die(self, events: list[StreamEvent], failure: str) -> None:
        """The engine cannot continue: fail every live request with `failure`, tell the loop, stop."""
        logger.error("the engine cannot continue: %s", failure)
        self.fatal = failure
        events = events + self._fail_all(failure)
        self._live.clear()
        for cmd in self._cmds:  # calls posted meanwhile (a /metrics scrape) must not wait forever
            if cmd[0] == "call":
                self._to_loop(self._resolve, cmd[2], None, EngineDead(failure))
        self._cmds.clear()
        self._to_loop(self._dispatch, events)
        if self.on_fatal is not None:
            self._to_loop(self.on_fatal, failure)

    def _fail_all(self, message: str) -> list[StreamEvent]:
        events = []
        for rid in list(self._live):
            try:
                self.llm.abort_request(rid)
            except Exception:
                logger.exception("abort after a failed step")
            events.append(_error_event(rid, message))
        # the aborts are reported by the next step(); their queues are gone by then
        return events


def _error_event(rid: str, message: str) -> StreamEvent:
    out = RequestOutput(request_id=rid, prompt=None, prompt_token_ids=[], text="", token_ids=[], finished=True,
                        finish_reason="error", error=message)
    return StreamEvent(None, rid, "", [], True, "error", out)
