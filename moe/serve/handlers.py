"""The endpoint handlers, one module-level function each. `@endpoint` gives every handler the
app's `ServerState` (from `request.app.state.serve`), checks the API key, turns an `APIError`
(or any other exception) into OpenAI's error JSON, and counts the response for /metrics."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from typing import Awaitable, Callable

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from moe.serve.openai_format import ChatChunks, CompletionChunks, chat_completion, text_completion
from moe.serve.protocol import (APIError, ChatCompletionRequest, CompletionRequest, TokenizeRequest, bad_request,
                                validation_error)
from moe.serve.driver import EngineDead
from moe.serve.state import ServerState
from moe.serve.streaming import Generation, read_json, sse_stream, until_disconnect

logger = logging.getLogger(__name__)

Handler = Callable[[Request, ServerState], Awaitable[Response]]


def endpoint(name: str, auth: bool = True) -> Callable[[Handler], Callable[[Request], Awaitable[Response]]]:
    def deco(fn: Handler):
        @functools.wraps(fn)
        async def handler(request: Request) -> Response:
            state: ServerState = request.app.state.serve
            try:
                if auth:
                    state.check_auth(request)
                resp = await fn(request, state)
            except APIError as e:
                resp = JSONResponse(e.body(), status_code=e.status)
            except ClientDisconnect:  # the client left while sending its body: not a server error
                resp = Response(status_code=499)  # nginx's "client closed request"; nobody reads it
            except Exception as e:  # never let one request take the server down
                logger.exception("%s failed", name)
                err = APIError(500, f"internal error: {type(e).__name__}: {e}", "server_error")
                resp = JSONResponse(err.body(), status_code=500)
            state.metrics.http[(name, resp.status_code)] += 1
            return resp
        return handler
    return deco


async def http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own errors (unknown path, wrong method) in OpenAI's error format."""
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    err = APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind)
    return JSONResponse(err.body(), status_code=exc.status_code)


def engine_stats(llm) -> tuple[dict, list[dict] | None]:
    """(on the driver thread) `llm.stats()` and, for a tensor-parallel engine, every rank's own figures."""
    rank_stats = getattr(getattr(llm, "runner", None), "rank_stats", None)  # moe/engine/parallel/runner.py
    return llm.stats(), (rank_stats() if rank_stats is not None else None)


# ---------------------------------------------------------------------------- parsing and waiting
async def parse_plain(request: Request, state: ServerState, cls):
    data = await read_json(request, state.max_request_bytes)
    try:
        req = cls.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None
    state.check_model(req.model)
    return req


async def parse_generation(request: Request, state: ServerState, cls):
    """A completion request: parsed, with unsupported options and too large an `n` rejected."""
    req = await parse_plain(request, state, cls)
    req.check_unsupported()
    if req.n > state.max_n:
        raise bad_request(f"n={req.n} exceeds this server's limit of {state.max_n}", param="n")
    return req


async def respond(request: Request, gen: Generation, build) -> Response:
    """Wait for every choice (aborting if the client leaves), then `build(outputs)`."""
    gen.check_capacity()
    gen.start()
    work = asyncio.ensure_future(gen.collect())
    watch = asyncio.ensure_future(until_disconnect(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            gen.close()
    if not work.done() or work.cancelled():
        return Response(status_code=499)  # client closed the request; nobody reads this
    outs = work.result()
    errors = [o.error for o in outs.values() if o.finish_reason == "error"]
    if errors:
        raise APIError(500, f"generation failed: {errors[0]}", "server_error")
    return JSONResponse(build([outs[i] for i in range(gen.n_choices)]))


def _include_usage(req) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


# ---------------------------------------------------------------------------- endpoints
@endpoint("health", auth=False)
async def health(request: Request, state: ServerState) -> Response:
    if not state.driver.alive:
        return JSONResponse({"status": "engine stopped"}, status_code=503)
    return JSONResponse({"status": "ok"})


@endpoint("models")
async def models(request: Request, state: ServerState) -> Response:
    return JSONResponse({"object": "list", "data": [{
        "id": state.model_name, "object": "model", "created": state.created, "owned_by": "moe-lab",
        "max_model_len": state.max_model_len}]})


@endpoint("metrics", auth=False)
async def metrics(request: Request, state: ServerState) -> Response:
    try:
        stats, ranks = await state.driver.call(engine_stats)
    except EngineDead as e:
        raise APIError(503, f"the engine is not running: {e}", "server_error") from None
    return PlainTextResponse(state.metrics.render(stats, state.driver.num_pending, ranks),
                             media_type="text/plain; version=0.0.4")


@endpoint("tokenize")
async def tokenize(request: Request, state: ServerState) -> Response:
    req = await parse_plain(request, state, TokenizeRequest)
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("give exactly one of prompt and messages")
    ids = state.encode(req.prompt) if req.prompt is not None else state.chat_ids(req.messages)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len})


@endpoint("chat_completions")
async def chat_completions(request: Request, state: ServerState) -> Response:
    req: ChatCompletionRequest = await parse_generation(request, state, ChatCompletionRequest)
    ids = state.chat_ids(req.messages)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    top_n = (req.top_logprobs or 0) if req.logprobs else None
    params = state.sampling_params(req, ids, max_tokens, top_n, state.chat_stop_ids, prompt_field="messages")
    gen = Generation(state, [ids], [params])
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": state.model_name,
            "system_fingerprint": None}
    if not req.stream:
        return await respond(request, gen, lambda outs: chat_completion(head, outs, gen.prompts, state.token_texts,
                                                                       top_n))
    gen.check_capacity()
    chunks = ChatChunks(gen.n_choices, state.token_texts, top_n)
    return sse_stream(gen, {**head, "object": "chat.completion.chunk"}, _include_usage(req), chunks.choice,
                      preamble=chunks.preamble())


@endpoint("completions")
async def completions(request: Request, state: ServerState) -> Response:
    req: CompletionRequest = await parse_generation(request, state, CompletionRequest)
    prompts: list[list[int]] = []
    params = []
    for p in req.prompts():
        ids = state.encode(p) if isinstance(p, str) else list(p)
        params.append(state.sampling_params(req, ids, req.max_tokens, req.logprobs, [], prompt_field="prompt"))
        prompts.append(ids)
    gen = Generation(state, prompts, params)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": state.model_name, "system_fingerprint": None}
    if not req.stream:
        return await respond(request, gen, lambda outs: text_completion(head, outs, gen.prompts, state.token_texts,
                                                                       req.logprobs))
    gen.check_capacity()
    chunks = CompletionChunks(gen.n_choices, state.token_texts, req.logprobs)
    return sse_stream(gen, head, _include_usage(req), chunks.choice, preamble=chunks.preamble())
