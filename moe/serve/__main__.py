"""`python -m moe.serve <checkpoint> [--host 127.0.0.1] [--port 8000] [--api-key KEY] ...`

Loads the checkpoint into the inference engine and serves it with uvicorn (one asyncio loop;
the engine steps on its own thread). `--port 0` picks a free port; the line
`moe.serve: listening on http://HOST:PORT` on stdout says which, once the socket listens.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
import sys
from pathlib import Path
from typing import Optional

from moe.hf.layout import is_hf_dir
from moe.routing.options import add_routing_arguments, routing_from_args
from moe import cli
from moe.attention import PAGED_BACKENDS
from moe.errors import ConfigError, UserError
from moe.quant import allowed_schemes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m moe.serve",
                                description="Serve a moe-lab checkpoint behind an OpenAI-compatible HTTP API.")
    p.add_argument("checkpoint", help="a checkpoint file, a run directory (its newest checkpoint) or an HF "
                                      "model directory of a supported family (python -m moe.hf --help)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="0 = any free port (printed on stdout)")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients must use (default: run directory name + step)")
    p.add_argument("--api-key", default=os.environ.get("MOE_SERVE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 and /tokenize (env MOE_SERVE_API_KEY)")
    p.add_argument("--max-request-bytes", type=int, default=2 * 2**20, help="larger request bodies get a 413")
    p.add_argument("--max-pending-requests", type=int, default=1024,
                   help="choices in flight beyond which new requests get a 503")
    p.add_argument("--max-n", type=int, default=16, help="largest `n` accepted")
    p.add_argument("--clip-max-tokens", action="store_true",
                   help="cap a max_tokens beyond the context left after the prompt to what is left (default: "
                        "answer a 400 naming the limit, as the OpenAI API and vLLM do)")
    g = p.add_argument_group("engine")
    g.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    g.add_argument("--dtype", default=None, help="fp32 | bf16 | fp16 (default: bf16 on CUDA, fp32 on CPU)")
    g.add_argument("--backend", default="auto", help=f"attention backend: auto | {' | '.join(PAGED_BACKENDS)}")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-blocks", type=int, default=None, help="KV blocks (default: sized by the engine)")
    g.add_argument("--max-num-seqs", type=int, default=256, help="sequences per engine step")
    g.add_argument("--max-num-batched-tokens", type=int, default=2048, help="tokens per engine step")
    g.add_argument("--max-model-len", type=int, default=None, help="default: the model's max_seq_len")
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--no-routing-stats", action="store_true",
                   help="do not collect routing statistics (the moe_serve_routing gauges of /metrics)")
    g.add_argument("--seed", type=int, default=None, help="engine RNG seed for requests without their own")
    g.add_argument("--speculative", default=None, help="speculative decoding for every request: ngram | self | "
                   "a JSON object of SpeculativeConfig options, e.g. '{\"method\": \"draft\", \"model\": \"runs/small\"}'")
    g.add_argument("--compile", action="store_true", help="compiled static-shape decode steps (torch.compile; CUDA "
                   "graphs on CUDA)")
    g.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="ranks the model is split over (T > 1 spawns T - 1 worker processes; "
                        "docs/guides/multi_device.md)")
    g.add_argument("--expert-parallel", action="store_true",
                   help="with --tensor-parallel-size T: each rank holds n_experts / T whole experts")
    g.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    g.add_argument("--quantization", default=None,
                   help=f"serve the weights quantized: {' | '.join(allowed_schemes())} (docs/guides/quantization.md)")
    g.add_argument("--quant-calib-path", default=None, help="awq: calibration text file")
    g.add_argument("--kv-cache-dtype", default="auto", help="auto (the model's dtype) | fp8_e4m3")
    g.add_argument("--profile-steps", type=int, default=None,
                   help="torch.profiler over this many engine steps (after the first): a Chrome trace and a "
                        "summary of the top operators into --profile-dir (docs/guides/profiling.md)")
    g.add_argument("--profile-dir", default=None, help="where --profile-steps writes (default: ./profile)")
    add_routing_arguments(p)
    c = p.add_argument_group("expert offloading (docs/guides/offload.md)")
    c.add_argument("--expert-cache-experts-per-layer", type=int, default=None,
                   help="serve routed experts from a memory-mapped slow tier through this many slots per MoE layer")
    c.add_argument("--expert-cache-memory", default=None, help="or a byte budget for all slots, e.g. 8GB")
    c.add_argument("--expert-cache-policy", default=None, help="lru (default) | lfu | lookahead | ondemand")
    c.add_argument("--expert-cache-dir", default=None, help="where the slow tier's file goes (default: a temp dir)")
    p.add_argument("--timeout-keep-alive", type=float, default=15,
                   help="seconds an idle keep-alive connection stays open (clients should expire theirs sooner)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--access-log", action="store_true", help="log every HTTP request (off: it costs CPU)")
    return p


def profile_option(args) -> Optional[dict]:
    """The engine's `profile` option from --profile-steps / --profile-dir (the engine checks the values)."""
    if args.profile_steps is None:
        if args.profile_dir is not None:
            raise ConfigError("--profile-dir needs --profile-steps N (the engine steps to record)")
        return None
    if args.profile_steps < 1:
        raise ConfigError(f"--profile-steps {args.profile_steps} must be >= 1 (the engine steps to record)")
    return {"steps": args.profile_steps, **({"dir": args.profile_dir} if args.profile_dir else {})}


def expert_cache_option(args) -> Optional[dict]:
    """The engine's `expert_cache` option from the --expert-cache-* flags (the engine checks the values)."""
    opts = {"experts_per_layer": args.expert_cache_experts_per_layer, "memory": args.expert_cache_memory,
            "policy": args.expert_cache_policy, "dir": args.expert_cache_dir}
    if opts["experts_per_layer"] is None and opts["memory"] is None:
        if opts["policy"] is not None or opts["dir"] is not None:
            raise ConfigError("--expert-cache-policy / --expert-cache-dir need --expert-cache-experts-per-layer N "
                              "or --expert-cache-memory SIZE")
        return None
    return {k: v for k, v in opts.items() if v is not None}


def default_model_name(checkpoint: str) -> str:
    from moe.checkpoint import resolve_checkpoint  # lazy: torch is not needed for --help

    if is_hf_dir(checkpoint):  # an HF model directory: its name (e.g. OLMoE-1B-7B-0924)
        name = Path(os.path.expanduser(str(checkpoint))).resolve().name
        return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "moe-lab"
    path = resolve_checkpoint(checkpoint)
    run = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    m = re.match(r"^step_(\d+)", path.name)
    name = run.name + (f"-step{int(m.group(1))}" if m else "")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "moe-lab"


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


@cli.guarded
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # lazy: `--help` and argument errors answer at once, without importing torch and the model
    from moe.engine import LLM
    from moe.engine.config import speculative_option  # lazy: with the engine, as above
    from moe.serve.app import create_app  # lazy, as above
    import torch
    import uvicorn

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        name = args.served_model_name or default_model_name(args.checkpoint)
        quant = ({"scheme": args.quantization, **({"calib_path": args.quant_calib_path} if args.quant_calib_path else {})}
                 if args.quantization else None)
        routing = routing_from_args(args)
        llm = LLM(args.checkpoint, routing=routing, quantization=quant, device=args.device, dtype=args.dtype, attention_backend=args.backend,
                  block_size=args.block_size, num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                  enable_prefix_caching=not args.no_prefix_caching, seed=args.seed,
                  collect_routing_stats=not args.no_routing_stats, speculative=speculative_option(args.speculative),
                  compile=args.compile, kv_cache_dtype=args.kv_cache_dtype, profile=profile_option(args),
                  expert_cache=expert_cache_option(args), tensor_parallel_size=args.tensor_parallel_size,
                  expert_parallel=args.expert_parallel)
    except (UserError, ValueError) as e:  # no checkpoint there, a bad engine option: one line, exit 2
        print(f"error: {cli.one_line(e)}", file=sys.stderr)
        return cli.EXIT_USER_ERROR
    print(cli.engine_settings(llm, routing), file=sys.stderr, flush=True)  # what it serves, before it listens
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        logging.getLogger("moe.serve").warning("serving on %s without --api-key: anyone who can reach it can use it",
                                               args.host)
    fatal: list[str] = []  # why the engine stopped for good (a rank died): the server then exits non-zero
    server: list = []

    def on_fatal(message: str) -> None:
        fatal.append(message)
        if server:
            server[0].should_exit = True

    app = create_app(llm, name, api_key=args.api_key, max_request_bytes=args.max_request_bytes,
                     max_pending_requests=args.max_pending_requests, max_n=args.max_n,
                     clip_max_tokens=args.clip_max_tokens, on_fatal=on_fatal)
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        llm.shutdown()
        return 2
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"moe.serve: listening on http://{shown}:{port} (model {name!r}, {Path(str(args.checkpoint))})", flush=True)
    config = uvicorn.Config(app, log_level=args.log_level, access_log=args.access_log, lifespan="on",
                            timeout_keep_alive=args.timeout_keep_alive, timeout_graceful_shutdown=5)
    server.append(uvicorn.Server(config))
    try:
        server[0].run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the captured SIGINT after its graceful shutdown
        pass
    finally:
        llm.shutdown()  # a tensor-parallel engine's worker processes
    if fatal:
        print(f"error: the engine stopped: {fatal[0]}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
