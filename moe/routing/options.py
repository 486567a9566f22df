"""The routing-ablation options of the command lines: change how a loaded model routes without
retraining (`Transformer.set_routing`; `load_model(..., routing=...)`, `LLM(path, routing=...)`).

Imports nothing heavy (no torch), so `python -m moe.serve --help` answers at once.
"""

from __future__ import annotations

from typing import Any

from moe.errors import ConfigError

# What `routing=` may change (the RouterConfig fields that need no retraining to change).
ROUTING_OPTIONS = ("top_k", "drop_experts", "renormalize")


def check_routing(routing: dict) -> dict:
    """`routing` itself; a ConfigError naming any key that is not a routing option."""
    unknown = sorted(set(routing) - set(ROUTING_OPTIONS))
    if unknown:
        raise ConfigError(f"routing option(s) {unknown} cannot change on a loaded model; choose from "
                          f"{list(ROUTING_OPTIONS)}")
    return routing


def add_routing_arguments(parser) -> None:
    """The `--router-top-k`, `--drop-experts`, `--router-renormalize` options of the engine's
    command lines (`python -m moe.serve`, `python -m moe.generate`): an inference-time routing
    ablation of the loaded model (`LLM(path, routing=...)`)."""
    g = parser.add_argument_group("routing ablation (no retraining)")
    g.add_argument("--router-top-k", type=int, default=None, help="experts per token (default: the model's)")
    g.add_argument("--drop-experts", default=None,
                   help="comma-separated expert ids removed from every router, e.g. 1,5 (never selected)")
    g.add_argument("--router-renormalize", default=None, choices=["true", "false"],
                   help="divide the top-k weights by their sum (default: the model's)")


def routing_from_args(args) -> dict:
    """The `routing` dict of `add_routing_arguments`' options (only those given); a ConfigError
    naming `--drop-experts` for a malformed list."""
    routing: dict[str, Any] = {}
    if args.router_top_k is not None:
        routing["top_k"] = args.router_top_k
    if args.drop_experts is not None:
        try:
            routing["drop_experts"] = [int(e) for e in str(args.drop_experts).split(",") if e.strip()]
        except ValueError:
            raise ConfigError(f"--drop-experts={args.drop_experts!r} must be comma-separated expert ids, "
                              "e.g. 1,5") from None
    if args.router_renormalize is not None:
        routing["renormalize"] = args.router_renormalize == "true"
    return routing
