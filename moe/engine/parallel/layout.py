"""Whether a model can be split over T ranks: checked on the model's config before any worker
process starts, one ConfigError naming the field and the numbers."""

from __future__ import annotations

from torch import nn

from moe.config import ModelConfig
from moe.errors import ConfigError
from moe.experts import SwiGLUExperts

SPLIT_MODULES = ("qkv_proj", "q_proj", "q_b_proj", "kv_b_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "experts",
                 "lm_head")


def check_layout(cfg: ModelConfig, size: int, expert_parallel: bool) -> None:
    """Raise a ConfigError when `cfg` cannot be served with tensor_parallel_size=`size`."""
    T = size
    where = f"tensor_parallel_size={T}"
    if cfg.qk_norm == "full":
        raise ConfigError(f"model.qk_norm='full' is not supported with {where} (the norm spans every head's "
                          "projection, so each rank would need all of them); use tensor_parallel_size=1")
    if cfg.expert_bias or cfg.expert_activation != "swiglu":
        raise ConfigError(f"experts with biases or activation {cfg.expert_activation!r} (model.expert_bias / "
                          f"model.expert_activation) are not supported with {where}; use tensor_parallel_size=1")
    check_divisible(cfg, T, expert_parallel)


def check_divisible(cfg: ModelConfig, T: int, expert_parallel: bool) -> None:
    """The sizes that must split evenly over T ranks (also what the multi-device planner asks)."""
    where = f"tensor_parallel_size={T}"
    # MLA's latent (its only kv "head") is replicated on every rank: only its query heads split
    for name in ("n_heads",) if cfg.attention_kind == "mla" else ("n_heads", "n_kv_heads"):
        v = getattr(cfg, name)
        if v % T:
            raise ConfigError(f"model.{name}={v} is not divisible by {where}: each rank holds an equal share of the "
                              f"heads; choose a tensor_parallel_size that divides {v}")
    _check_ffn(cfg, T, where, expert_parallel)
    if expert_parallel and cfg.n_experts % T:
        more = " (more ranks than experts)" if T > cfg.n_experts else ""
        raise ConfigError(f"model.n_experts={cfg.n_experts} is not divisible by {where} with expert_parallel=True"
                          f"{more}: each rank holds n_experts / tensor_parallel_size whole experts")


def _check_ffn(cfg: ModelConfig, T: int, where: str, expert_parallel: bool) -> None:
    hidden = {"model.shared_expert_hidden": cfg.resolved_shared_hidden or 0}
    if not expert_parallel:  # experts split by hidden units (with expert_parallel: whole experts per rank)
        hidden["model.expert_hidden"] = cfg.expert_hidden
    if any(not cfg.is_moe_layer(i) for i in range(cfg.n_layers)):
        hidden["model.dense_hidden"] = cfg.dense_hidden or cfg.expert_hidden * cfg.router.top_k
    for name, v in hidden.items():
        if v % T:
            raise ConfigError(f"{name}={v} is not divisible by {where}: each rank holds a slice of every FFN's "
                              "hidden units")


def check_plain_modules(model, T: int) -> None:
    """Quantized weights (a checkpoint written by `python -m moe.quantize` loads quantized by
    itself) are refused: only plain `nn.Linear` projections and `SwiGLUExperts` are split."""
    for name, m in model.named_modules():
        if name.rsplit(".", 1)[-1] in SPLIT_MODULES and type(m) not in (nn.Linear, SwiGLUExperts):
            raise ConfigError(f"quantized weights ({name} is a {type(m).__name__}) are not supported with "
                              f"tensor_parallel_size={T}; serve the unquantized checkpoint or tensor_parallel_size=1")


def check_not_quantized(scheme, T: int) -> None:
    """A checkpoint stored quantized (`scheme`, None: it is not) cannot be split."""
    if scheme:
        raise ConfigError(f"quantized weights (the checkpoint is stored {scheme}) are not supported with "
                          f"tensor_parallel_size={T}; serve the unquantized checkpoint or tensor_parallel_size=1")
