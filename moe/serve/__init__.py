"""An OpenAI-compatible HTTP server for moe-lab checkpoints.

    python -m moe.serve runs/x --host 127.0.0.1 --port 8000   # then any OpenAI client:
    OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none").chat.completions.create(...)

Files: protocol (request schemas, OpenAI-style errors), engine (`AsyncEngine`: the engine on one
driver thread, events to per-request asyncio queues), streaming (body reading, SSE, `Generation`:
one HTTP request's engine requests), app (`create_app`: the Starlette app and its endpoints), metrics (Prometheus text), __main__ (the CLI, uvicorn). See docs/serving.md.
"""

from moe.serve.app import create_app
from moe.serve.engine import AsyncEngine

__all__ = ["create_app", "AsyncEngine"]
