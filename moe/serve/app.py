"""The OpenAI-compatible ASGI app (Starlette): `create_app(llm, model_name, ...)`.

Endpoints: `GET /health`, `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions`
(`stream: true` gives Server-Sent Events in OpenAI's chunk format, ending with `data: [DONE]`),
`POST /tokenize` (as vLLM's: the prompt's token ids and the context length) and `GET /metrics`
(Prometheus text). Every request is validated and tokenized on the event loop (bad input
answers a 400 in OpenAI's error format before anything reaches the engine), then its choices go
to the engine driver thread (`moe.serve.driver.EngineDriver`) as separate engine requests.
The handlers are in `handlers.py`, the shared state in `state.py`.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route

from moe.serve import handlers
from moe.serve.state import ServerState


def create_app(llm, model_name: str = "moe-lab", *, api_key: Optional[str] = None,
               max_request_bytes: int = 2 * 2**20, max_pending_requests: int = 1024, max_n: int = 16,
               clip_max_tokens: bool = False, on_fatal: Optional[Callable[[str], None]] = None) -> Starlette:
    """The ASGI app serving `llm` (an `moe.engine.LLM`) under `model_name`. The engine driver
    thread starts and stops with the app's lifespan; the app owns `llm` from then on.
    `clip_max_tokens`: cap a `max_tokens` beyond the context instead of answering a 400. `on_fatal(message)`
    is called (on the loop) when the engine cannot continue, e.g. a rank of a tensor-parallel engine died."""
    state = ServerState(llm, model_name, api_key, max_request_bytes, max_pending_requests, max_n, clip_max_tokens,
                        on_fatal)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.driver.start()
        try:
            yield
        finally:
            await state.driver.stop()

    routes = [
        Route("/health", handlers.health, methods=["GET"]),
        Route("/metrics", handlers.metrics, methods=["GET"]),
        Route("/v1/models", handlers.models, methods=["GET"]),
        Route("/v1/completions", handlers.completions, methods=["POST"]),
        Route("/v1/chat/completions", handlers.chat_completions, methods=["POST"]),
        Route("/tokenize", handlers.tokenize, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: handlers.http_error})
    app.state.serve = state  # the handlers' ServerState
    return app
