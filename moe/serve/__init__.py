"""An OpenAI-compatible HTTP server for moe-lab checkpoints.

    python -m moe.serve runs/x --host 127.0.0.1 --port 8000   # then any OpenAI client:
    OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none").chat.completions.create(...)

Files: protocol (request schemas, OpenAI-style errors), driver (`EngineDriver`: the engine on one
thread, events to per-request asyncio queues), state (`ServerState`: what the handlers share;
tokenizing and request checks, with the engine's `validate_request`), openai_format (response
bodies, logprobs, streamed choices), streaming (body reading, `Generation`: one HTTP request's
engine requests, SSE), handlers (the endpoints), app (`create_app`: routes, errors, lifespan),
metrics (Prometheus text), __main__ (the CLI, uvicorn). See docs/guides/serving.md.
"""

from moe.serve.app import create_app
from moe.serve.driver import EngineDriver

__all__ = ["create_app", "EngineDriver"]
