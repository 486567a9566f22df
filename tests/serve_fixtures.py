"""A served tiny model for the server and serving-benchmark tests (a pytest plugin, registered in
tests/conftest.py): a tiny random model + a small BPE tokenizer, served by the real app under
uvicorn on a free loopback port, in a thread of the test process. Session-scoped and lazy: nothing
is built unless a test asks for `server`, `client`, `http`, `ref_llm`, `tiny_model` or `tok`."""

from __future__ import annotations

import copy
import queue
import socket
import threading
import time

import httpx

import pytest
import torch
from tests.conftest import with_variants

API_KEY = "test-key"
MODEL_NAME = "tiny-moe"
TEXT = ("the quick brown fox jumps over the lazy dog. once upon a time a little girl found a red ball. "
        "experts route tokens; the router picks the top k. she was happy and they played all day. ") * 4


@pytest.fixture(scope="session")
def tok():
    from moe.data import Tokenizer
    return Tokenizer.train([TEXT] * 10, vocab_size=320)


@pytest.fixture(scope="session")
def tiny_model(tok):
    from moe.config import ModelConfig
    from moe.routing.routers import router_config
    from moe.model import Transformer

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4,
                      expert_hidden=64, max_seq_len=512)
    return Transformer(with_variants(cfg, router_config(top_k=2))).eval()


@pytest.fixture(scope="session")
def ref_llm(tiny_model, tok):
    """A separate engine (on a copy of the weights) for reference outputs."""
    from moe.engine import LLM
    return LLM.from_model(copy.deepcopy(tiny_model), tok, collect_routing_stats=False)


class ServerThread:
    """uvicorn serving `app` on 127.0.0.1:<free port> in a background thread."""

    def __init__(self, app):
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                                    timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()


@pytest.fixture(scope="session")
def server(tiny_model, tok):
    from moe.engine import LLM
    from moe.serve import create_app

    llm = LLM.from_model(tiny_model, tok, max_num_seqs=32, seed=0)
    app = create_app(llm, MODEL_NAME, api_key=API_KEY, max_request_bytes=64 * 1024, max_n=4)
    with ServerThread(app) as s:
        s.app = app
        yield s


@pytest.fixture
def client(server):
    from openai import OpenAI
    with OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=30) as c:
        yield c


@pytest.fixture
def http(server):
    import httpx
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30) as c:
        yield c


def read_metrics(http) -> dict[str, float]:
    """The /metrics samples as {'name{labels}': value}."""
    out = {}
    for line in http.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def wait_for(cond, timeout: float = 10.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(interval)


def make_checkpoint(run_dir, tok, n_layers: int = 1, max_seq_len: int = 128):
    """A step-5 moe-lab checkpoint of a tiny random model under `run_dir` (what `python -m moe.serve` loads)."""
    from moe.checkpoint import checkpoint_path, save_checkpoint, tokenizer_files
    from moe.config import load_config, to_dict
    from moe.model import Transformer

    cfg = load_config({"model": dict(vocab_size=tok.vocab_size, d_model=32, n_layers=n_layers, n_heads=4, n_kv_heads=2,
                                     n_experts=4, expert_hidden=32, max_seq_len=max_seq_len),
                       "router": {"top_k": 2}, "data": {"name": "text", "path": "unused.txt"},
                       "logger": {"name": "none"}})
    model = Transformer(cfg.model)
    return save_checkpoint(checkpoint_path(run_dir, 5), {"model": model.state_dict(), "config": to_dict(cfg),
                                                         "tokenizer": tokenizer_files(tok), "step": 5})


def serving_url(proc) -> str:
    """The URL a `python -m moe.serve` subprocess (stdout piped, text) listens on, once its /health
    answers 200 (the socket listens before uvicorn has started); an AssertionError with the
    process's output if it never says where it listens."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    url, seen, deadline = None, [], time.monotonic() + 90
    while url is None and time.monotonic() < deadline and proc.poll() is None:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        seen.append(line)
        if line.startswith("moe.serve: listening on "):
            url = line.split()[3]
    assert url, "".join(seen)
    for _ in range(200):
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    return url
