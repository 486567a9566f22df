"""Router variants, registered by name (`router.name` / `configs/router/<name>.yaml`)."""

from moe.routers.base import ROUTERS, Router, RouterOutput
from moe.routers import topk  # noqa: F401  (registers "topk")
from moe.routers import aux_free, expert_choice, hash, sinkhorn, switch  # noqa: F401  (register the variants)

__all__ = ["ROUTERS", "Router", "RouterOutput", "build_router"]


def build_router(cfg, d_model: int, n_experts: int) -> Router:
    return ROUTERS.get(cfg.name)(cfg, d_model, n_experts)
