"""The OpenAI-compatible ASGI app (Starlette): `create_app(llm, model_name, ...)`.

Endpoints: `GET /health`, `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions`
(`stream: true` gives Server-Sent Events in OpenAI's chunk format, ending with `data: [DONE]`),
`POST /tokenize` (as vLLM's: the prompt's token ids and the context length) and `GET /metrics`
(Prometheus text). Every request is validated and tokenized on the event loop, then its choices
go to the engine driver (`moe.serve.engine.AsyncEngine`) as separate engine requests; bad input
answers a 400 in OpenAI's error format before anything reaches the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
import uuid
from typing import Optional

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from moe.engine import SamplingParams
from moe.serve.engine import AsyncEngine
from moe.serve.metrics import ServerMetrics
from moe.serve.protocol import (APIError, ChatCompletionRequest, CompletionRequest, TokenizeRequest, bad_request,
                                validation_error)
from moe.serve.streaming import Generation, SSEResponse, read_json, sse, until_disconnect, usage

logger = logging.getLogger(__name__)

OPENAI_FINISH = {"stop": "stop", "length": "length", "abort": "abort", "error": "error"}


# ---------------------------------------------------------------------------- state + handlers
class ServerState:
    def __init__(self, llm, model_name: str, api_key: Optional[str], max_request_bytes: int, max_pending: int,
                 max_n: int):
        self.llm = llm
        self.tokenizer = llm.tokenizer
        self.model_name = model_name
        self.api_key = api_key
        self.max_request_bytes, self.max_pending, self.max_n = max_request_bytes, max_pending, max_n
        self.max_model_len = llm.max_model_len
        self.vocab_size = llm.vocab_size
        self.num_blocks, self.block_size = llm.num_blocks, llm.block_size
        self.add_bos = llm.add_bos
        self.created = int(time.time())
        self.metrics = ServerMetrics()
        self.engine = AsyncEngine(llm, on_events=self.metrics.on_events)
        end = getattr(self.tokenizer, "special_ids", {}).get("<|end|>") if self.tokenizer is not None else None
        self.chat_stop_ids = [end] if end is not None else []  # the chat template ends every turn with it
        self._tok_text: dict[int, str] = {}

    # ---------------------------------------------------------------- checks
    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise APIError(401, "Incorrect or missing API key (send 'Authorization: Bearer <key>').",
                           code="invalid_api_key")

    def check_model(self, model: Optional[str]) -> None:
        if model is not None and model != self.model_name:
            raise APIError(400, f"The model `{model}` does not exist; this server serves `{self.model_name}`.",
                           param="model", code="model_not_found")

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise bad_request("this model has no tokenizer: send the prompt as token ids")
        return list(self.tokenizer.encode(text, add_bos=self.add_bos))

    def chat_ids(self, messages) -> list[int]:
        if self.tokenizer is None:
            raise bad_request("this model has no tokenizer (and so no chat template)")
        msgs = [m.as_template_message(i) for i, m in enumerate(messages)]
        try:
            text = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
        except Exception as e:  # ValueError, TypeError, jinja2 errors: the messages' fault
            raise bad_request(f"bad chat messages: {e}", param="messages") from None
        return self.encode(text)

    def check_prompt(self, ids: list[int], param: str = "messages") -> None:
        if not ids:
            raise bad_request("the prompt is empty (it encodes to no tokens)", param=param)
        bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size]
        if bad:
            raise bad_request(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})",
                              param=param)
        if len(ids) >= self.max_model_len:
            raise bad_request(f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                              f"prompt has {len(ids)} tokens (at most {self.max_model_len - 1} leave room to "
                              "generate).",
                              param=param, code="context_length_exceeded")

    def sampling_params(self, req, ids: list[int], max_tokens: Optional[int], logprobs: Optional[int],
                        extra_stop_ids: list[int]) -> list[SamplingParams]:
        room = self.max_model_len - len(ids)
        mt = room if max_tokens is None else min(max_tokens, room)
        cached = min(len(ids) + mt, self.max_model_len) - 1
        if -(-cached // self.block_size) > self.num_blocks:
            raise bad_request(f"the request needs up to {cached} tokens of KV cache but the server holds "
                              f"{self.num_blocks * self.block_size}; lower max_tokens", param="max_tokens")
        stop_ids = list(req.stop_token_ids or [])
        if not req.ignore_eos:
            stop_ids += [t for t in extra_stop_ids if t not in stop_ids]
        out = []
        for j in range(req.n):
            try:
                out.append(SamplingParams(
                    temperature=1.0 if req.temperature is None else req.temperature,
                    top_p=1.0 if req.top_p is None else req.top_p,
                    top_k=-1 if req.top_k is None else req.top_k,
                    min_p=0.0 if req.min_p is None else req.min_p,
                    repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                    seed=None if req.seed is None else req.seed + j,  # n choices differ, reproducibly
                    max_tokens=mt, stop=req.stop, stop_token_ids=stop_ids or None, ignore_eos=req.ignore_eos,
                    logprobs=logprobs))
            except ValueError as e:
                raise bad_request(str(e)) from None
        return out

    # ---------------------------------------------------------------- logprobs
    def token_text(self, tid: int) -> str:
        s = self._tok_text.get(tid)
        if s is None:
            s = self.tokenizer.decode([tid], skip_special_tokens=False) if self.tokenizer is not None else str(tid)
            if len(self._tok_text) < 1_000_000:
                self._tok_text[tid] = s
        return s

    def chat_logprobs(self, token_ids, lps, top_n: int) -> list[dict]:
        content = []
        for tid, d in zip(token_ids, lps):
            if d is None:
                continue
            s = self.token_text(tid)
            top = sorted(d.items(), key=lambda kv: -kv[1])[:top_n]
            content.append({"token": s, "logprob": d[tid], "bytes": list(s.encode()),
                            "top_logprobs": [{"token": self.token_text(t), "logprob": v,
                                              "bytes": list(self.token_text(t).encode())} for t, v in top]})
        return content

    def completion_logprobs(self, token_ids, lps, top_n: int, offset: int = 0) -> dict:
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for tid, d in zip(token_ids, lps):
            if d is None:
                continue
            s = self.token_text(tid)
            out["tokens"].append(s)
            out["token_logprobs"].append(d[tid])
            top: dict[str, float] = {}
            for t, v in sorted(d.items(), key=lambda kv: -kv[1])[:top_n]:
                top.setdefault(self.token_text(t), v)  # tokens that decode alike: keep the likelier
            out["top_logprobs"].append(top)
            out["text_offset"].append(offset)
            offset += len(s)
        return out


def _chunk_finish(ev):
    """The OpenAI finish_reason of a streamed event (None until the choice finishes)."""
    return OPENAI_FINISH.get(ev.finish_reason, ev.finish_reason) if ev.finished else None


def _sse_response(gen, head: dict, include_usage: bool, make_choice, preamble=()) -> SSEResponse:
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


def _streamed_logprobs(ev, sent: int):
    """(token ids, logprobs) of an event not yet streamed. `StreamEvent` carries no logprobs
    yet (see docs/serving.md), so they all come with the final event, from the output."""
    lps = getattr(ev, "logprobs", None)
    if lps is not None:
        return ev.token_ids, lps
    if ev.finished and ev.output is not None and ev.output.logprobs is not None:
        return ev.output.token_ids[sent:], ev.output.logprobs[sent:]
    return [], []


def create_app(llm, model_name: str = "moe-lab", *, api_key: Optional[str] = None,
               max_request_bytes: int = 2 * 2**20, max_pending_requests: int = 1024, max_n: int = 16) -> Starlette:
    """The ASGI app serving `llm` (an `moe.engine.LLM`) under `model_name`. The engine driver
    thread starts and stops with the app's lifespan; the app owns `llm` from then on."""
    state = ServerState(llm, model_name, api_key, max_request_bytes, max_pending_requests, max_n)

    def endpoint(name: str, auth: bool = True):
        def deco(fn):
            async def handler(request: Request) -> Response:
                try:
                    if auth:
                        state.check_auth(request)
                    resp = await fn(request)
                except APIError as e:
                    resp = JSONResponse(e.body(), status_code=e.status)
                except Exception as e:  # never let one request take the server down
                    logger.exception("%s failed", name)
                    err = APIError(500, f"internal error: {type(e).__name__}: {e}", "server_error")
                    resp = JSONResponse(err.body(), status_code=500)
                state.metrics.http[(name, resp.status_code)] += 1
                return resp
            return handler
        return deco

    async def parse_plain(request: Request, cls):
        data = await read_json(request, state.max_request_bytes)
        try:
            req = cls.model_validate(data)
        except ValidationError as e:
            raise validation_error(e) from None
        state.check_model(req.model)
        return req

    async def parse(request: Request, cls):
        req = await parse_plain(request, cls)
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

    # ------------------------------------------------------------------ endpoints
    @endpoint("health", auth=False)
    async def health(request: Request) -> Response:
        if not state.engine.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @endpoint("models")
    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": state.created, "owned_by": "moe-lab",
            "max_model_len": state.max_model_len}]})

    @endpoint("metrics", auth=False)
    async def metrics(request: Request) -> Response:
        stats = await state.engine.call(lambda llm: llm.stats())
        return PlainTextResponse(state.metrics.render(stats, state.engine.num_pending),
                                 media_type="text/plain; version=0.0.4")

    @endpoint("tokenize")
    async def tokenize(request: Request) -> Response:
        req = await parse_plain(request, TokenizeRequest)
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("give exactly one of prompt and messages")
        ids = state.encode(req.prompt) if req.prompt is not None else state.chat_ids(req.messages)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len})

    @endpoint("chat_completions")
    async def chat_completions(request: Request) -> Response:
        req: ChatCompletionRequest = await parse(request, ChatCompletionRequest)
        ids = state.chat_ids(req.messages)
        state.check_prompt(ids, "messages")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        top_n = (req.top_logprobs or 0) if req.logprobs else None
        params = state.sampling_params(req, ids, max_tokens, top_n, state.chat_stop_ids)
        gen = Generation(state, [ids], [params])
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": cid, "created": created, "model": state.model_name, "system_fingerprint": None}

        if not req.stream:
            def build(outs):
                return {**head, "object": "chat.completion", "choices": [{
                    "index": i, "message": {"role": "assistant", "content": o.text},
                    "logprobs": {"content": state.chat_logprobs(o.token_ids, o.logprobs, top_n)}
                    if top_n is not None else None,
                    "finish_reason": OPENAI_FINISH.get(o.finish_reason, o.finish_reason)} for i, o in enumerate(outs)],
                    "usage": usage(gen.prompts, outs)}
            return await respond(request, gen, build)

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        gen.check_capacity()
        sent = [0] * gen.n_choices

        def chat_choice(i, ev):
            lp = None
            if top_n is not None:
                toks, lps = _streamed_logprobs(ev, sent[i])
                sent[i] += len(toks)
                if toks:
                    lp = {"content": state.chat_logprobs(toks, lps, top_n)}
            if not ev.text_delta and not ev.finished and lp is None:
                return None
            delta = {"content": ev.text_delta} if ev.text_delta else {}
            return {"index": i, "delta": delta, "logprobs": lp, "finish_reason": _chunk_finish(ev)}

        role_chunks = [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                        "finish_reason": None} for i in range(gen.n_choices)]
        return _sse_response(gen, {**head, "object": "chat.completion.chunk"}, include_usage, chat_choice,
                             preamble=role_chunks)

    @endpoint("completions")
    async def completions(request: Request) -> Response:
        req: CompletionRequest = await parse(request, CompletionRequest)
        prompts: list[list[int]] = []
        for k, p in enumerate(req.prompts()):
            ids = state.encode(p) if isinstance(p, str) else list(p)
            state.check_prompt(ids, "prompt")
            prompts.append(ids)
        top_n = req.logprobs
        params = [state.sampling_params(req, ids, req.max_tokens, top_n, []) for ids in prompts]
        gen = Generation(state, prompts, params)
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": cid, "object": "text_completion", "created": created, "model": state.model_name,
                "system_fingerprint": None}

        if not req.stream:
            def build(outs):
                return {**head, "choices": [{
                    "index": i, "text": o.text,
                    "logprobs": None if top_n is None else state.completion_logprobs(o.token_ids, o.logprobs, top_n),
                    "finish_reason": OPENAI_FINISH.get(o.finish_reason, o.finish_reason)} for i, o in enumerate(outs)],
                    "usage": usage(gen.prompts, outs)}
            return await respond(request, gen, build)

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        gen.check_capacity()
        sent = [0] * gen.n_choices
        offset = [0] * gen.n_choices

        def completion_choice(i, ev):
            lp = None
            if top_n is not None:
                toks, lps = _streamed_logprobs(ev, sent[i])
                sent[i] += len(toks)
                if toks:
                    lp = state.completion_logprobs(toks, lps, top_n, offset[i])
                    offset[i] += sum(len(t) for t in lp["tokens"])
            if not ev.text_delta and not ev.finished and lp is None:
                return None
            return {"index": i, "text": ev.text_delta, "logprobs": lp, "finish_reason": _chunk_finish(ev)}

        return _sse_response(gen, head, include_usage, completion_choice)

    # ------------------------------------------------------------------ app
    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        err = APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind)
        return JSONResponse(err.body(), status_code=exc.status_code)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.engine.start()
        try:
            yield
        finally:
            await state.engine.stop()

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.serve = state
    return app
