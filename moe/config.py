"""Typed, validated configuration.

Hydra composes YAML files from `configs/`; `load_config` merges the result onto these
dataclasses (so an unknown key is an error naming it) and `validate` checks the values
(so `top_k > n_experts` or a non-positive size is an error naming the field and what is
allowed). Each module owns its config: the model reads `ModelConfig`, the router
`RouterConfig`, and so on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A bad configuration value; the message names the field and the allowed values."""


@dataclass
class RouterConfig:
    """Which experts each token goes to, and the losses that keep the choice balanced."""

    name: str = "topk"
    top_k: int = 2
    renormalize: bool = True  # divide the top-k weights by their sum (Mixtral does)
    aux_loss_coef: float = 0.01  # Switch/GShard load balancing: E * sum_i f_i * P_i
    z_loss_coef: float = 0.001  # ST-MoE router z-loss: mean(logsumexp(logits)^2)
    temperature: float = 1.0  # logits are divided by it before the softmax
    jitter: float = 0.0  # multiplicative uniform noise on the router input in training
    capacity_factor: Optional[float] = None  # None = dropless; else per-expert capacity
    # --- options used by later variants (kept here so one schema covers every router)
    score_func: str = "softmax"  # softmax | sigmoid
    bias_update_rate: float = 0.001  # aux_free: per-step bias update size
    seq_aux_loss_coef: float = 0.0  # aux_free: optional sequence-level balance loss
    sinkhorn_iters: int = 8
    n_groups: int = 1  # group-limited routing: experts split in n_groups groups...
    topk_groups: int = 1  # ...and each token may use experts of topk_groups groups


@dataclass
class ModelConfig:
    """Decoder-only MoE transformer (Mixtral layout when no Mixtral-foreign option is set)."""

    vocab_size: Optional[int] = None  # None = the tokenizer's size
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: Optional[int] = None  # None = d_model // n_heads
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    n_experts: int = 8
    expert_hidden: int = 256  # SwiGLU hidden size of one expert
    n_shared_experts: int = 0  # always-on experts (DeepSeekMoE); 0 = none
    n_dense_layers: int = 0  # the first n layers use a dense SwiGLU FFN instead of MoE
    dense_hidden: Optional[int] = None  # None = expert_hidden * top_k
    init_std: float = 0.02

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.d_model // self.n_heads


@dataclass
class AttentionConfig:
    name: str = "sdpa"  # eager (reference) | sdpa | flash (CUDA + flash-attn)


@dataclass
class ExpertsConfig:
    name: str = "sorted"  # loop (reference) | sorted (grouped matmul) | sorted_fused | triton


@dataclass
class DataConfig:
    name: str = "pystdlib"  # pystdlib | text | hub
    # data=text: a file, a glob or a list of them. A .txt file is one document; a corpus of
    # a single document is split head (train) / tail (validation).
    path: Any = None
    text_field: str = "text"  # column holding the text in .jsonl / .parquet / hub data
    hub_name: Optional[str] = None
    hub_config: Optional[str] = None
    hub_split: str = "train"
    vocab_size: int = 4096  # byte-level BPE size (ignored when tokenizer_path is given)
    tokenizer_path: Optional[str] = None  # an existing tokenizer.json instead of training
    tokenizer_train_chars: int = 5_000_000  # BPE is trained on at most this many characters
    val_fraction: float = 0.05
    max_chars: Optional[int] = None  # cap on the corpus size (None = everything)
    num_proc: int = 2
    cache_dir: str = "~/.cache/moe-lab/data"


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 = off
    impl: str = "auto"  # auto | fused | foreach | for_loop


@dataclass
class TrainConfig:
    batch_size: int = 16  # sequences per optimizer step (before accumulation split)
    seq_len: int = 128
    grad_accum: int = 1  # micro-batches per step; batch_size must divide by it
    max_steps: int = 300  # length of the lr schedule
    stop_after: Optional[int] = None  # stop cleanly after this step, as a preemption would
    log_interval: int = 10
    eval_interval: int = 100
    eval_batches: int = 8
    ckpt_interval: int = 100
    keep_last: int = 2
    resume: Optional[str] = None  # None | auto | a checkpoint path
    dtype: str = "fp32"  # fp32 | bf16 (autocast)
    compile: bool = False
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    peak_flops: Optional[float] = None  # FLOP/s for MFU; None = measured matmul peak


@dataclass
class LoggerConfig:
    name: str = "wandb"  # wandb | none
    project: str = "moe-lab"
    mode: Optional[str] = None  # offline (default) | online | disabled; WANDB_MODE wins
    group: Optional[str] = None
    tags: list = field(default_factory=list)
    run_name: Optional[str] = None


@dataclass
class MonitorConfig:
    token_entropy_high: float = 0.85  # normalised token entropy above this: not learning
    load_entropy_low: float = 0.5  # normalised load entropy below this: collapse
    patience: int = 3  # consecutive log steps beyond a threshold before warning
    start_step: int = 100  # routers start near uniform: do not judge them before this step


@dataclass
class DistributedConfig:
    """Multi-process training on torch.distributed (`moe/distributed/`, launched by torchrun)."""

    name: str = "none"  # none (one process) | ddp | fsdp (FSDP2 per block) | ep (expert parallel)
    backend: str = "auto"  # auto = nccl on CUDA, gloo on CPU | nccl | gloo
    ep_size: int = 1  # distributed=ep: ranks that share one copy of the experts (n_experts / ep_size each)
    fsdp: bool = False  # distributed=ep: shard the non-expert parameters with FSDP2 (else DDP)
    mixed_precision: str = "auto"  # FSDP2 params: auto (bf16 on CUDA with train.dtype=bf16) | bf16 | fp32
    reshard_after_forward: bool = True  # FSDP2: free gathered block weights after forward (ZeRO-3)
    global_balance: bool = True  # router balance loss over the global batch (all-reduced f_i, P_i)
    timeout_s: int = 1800  # collective timeout


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    experts: ExpertsConfig = field(default_factory=ExpertsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    seed: int = 0


def _choice(name: str, value: Any, allowed) -> None:
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not allowed; choose one of {allowed}")


def _positive(name: str, value: Any, allow_zero: bool = False) -> None:
    ok = value is not None and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ConfigError(f"{name}={value!r} must be {'>= 0' if allow_zero else '> 0'}")


def validate_model(m: ModelConfig, r: RouterConfig) -> None:
    """Check the model and router settings that the model itself depends on."""
    for key in ("d_model", "n_layers", "n_heads", "n_kv_heads", "max_seq_len", "n_experts",
                "expert_hidden", "rope_theta", "norm_eps", "init_std"):
        _positive(f"model.{key}", getattr(m, key))
    for key in ("n_shared_experts", "n_dense_layers"):
        _positive(f"model.{key}", getattr(m, key), allow_zero=True)
    for key in ("vocab_size", "head_dim", "dense_hidden"):
        if getattr(m, key) is not None:
            _positive(f"model.{key}", getattr(m, key))
    if m.n_heads % m.n_kv_heads != 0:
        raise ConfigError(
            f"model.n_heads={m.n_heads} must be divisible by model.n_kv_heads={m.n_kv_heads} "
            f"(grouped-query attention shares each kv head among n_heads / n_kv_heads heads)")
    if m.head_dim is None and m.d_model % m.n_heads != 0:
        raise ConfigError(f"model.d_model={m.d_model} must be divisible by model.n_heads={m.n_heads} "
                          "(or set model.head_dim)")
    if m.resolved_head_dim % 2 != 0:
        raise ConfigError(f"head dim {m.resolved_head_dim} must be even for rotary embeddings")
    if m.n_dense_layers > m.n_layers:
        raise ConfigError(f"model.n_dense_layers={m.n_dense_layers} must be <= model.n_layers={m.n_layers}")
    _positive("router.top_k", r.top_k)
    if r.top_k > m.n_experts:
        raise ConfigError(f"router.top_k={r.top_k} must be <= model.n_experts={m.n_experts}")
    _positive("router.temperature", r.temperature)
    _positive("router.aux_loss_coef", r.aux_loss_coef, allow_zero=True)
    _positive("router.z_loss_coef", r.z_loss_coef, allow_zero=True)
    _positive("router.jitter", r.jitter, allow_zero=True)
    if r.capacity_factor is not None:
        _positive("router.capacity_factor", r.capacity_factor)
    _choice("router.score_func", r.score_func, ["softmax", "sigmoid"])
    _positive("router.n_groups", r.n_groups)
    if m.n_experts % r.n_groups != 0:
        raise ConfigError(f"model.n_experts={m.n_experts} must be divisible by router.n_groups={r.n_groups}")
    if not 1 <= r.topk_groups <= r.n_groups:
        raise ConfigError(f"router.topk_groups={r.topk_groups} must be in [1, router.n_groups={r.n_groups}]")
    from moe.routers import ROUTERS  # local: the registries import modules that import this file
    _choice("router.name", r.name, ROUTERS)


def validate(cfg: Config) -> Config:
    """Raise ConfigError naming the first bad field; return cfg unchanged otherwise."""
    from moe.attention import ATTENTION_BACKENDS
    from moe.experts import EXPERT_DISPATCH

    validate_model(cfg.model, cfg.router)
    _choice("attention.name", cfg.attention.name, ATTENTION_BACKENDS)
    _choice("experts.name", cfg.experts.name, EXPERT_DISPATCH)
    d = cfg.data
    _choice("data.name", d.name, ["pystdlib", "text", "hub"])
    if d.name == "text" and not d.path:
        raise ConfigError("data.path is required with data=text (a file, a glob or a list)")
    if d.name == "hub" and not d.hub_name:
        raise ConfigError("data.hub_name is required with data=hub (e.g. roneneldan/TinyStories)")
    _positive("data.vocab_size", d.vocab_size)
    if d.vocab_size < 300 and d.tokenizer_path is None:
        raise ConfigError(f"data.vocab_size={d.vocab_size} must be >= 300 (256 bytes + special tokens + merges)")
    _positive("data.tokenizer_train_chars", d.tokenizer_train_chars)
    _positive("data.num_proc", d.num_proc)
    if d.max_chars is not None:
        _positive("data.max_chars", d.max_chars)
    if not d.text_field:
        raise ConfigError("data.text_field must name the column holding the text (e.g. 'text')")
    if not 0.0 < d.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction={d.val_fraction} must be in (0, 1)")
    o = cfg.optim
    _choice("optim.name", o.name, ["adamw"])
    _choice("optim.impl", o.impl, ["auto", "fused", "foreach", "for_loop"])
    _positive("optim.lr", o.lr)
    _positive("optim.warmup_steps", o.warmup_steps, allow_zero=True)
    _positive("optim.grad_clip", o.grad_clip, allow_zero=True)
    if not 0.0 <= o.min_lr_ratio <= 1.0:
        raise ConfigError(f"optim.min_lr_ratio={o.min_lr_ratio} must be in [0, 1]")
    t = cfg.train
    for key in ("batch_size", "seq_len", "grad_accum", "max_steps", "log_interval",
                "eval_interval", "eval_batches", "ckpt_interval", "keep_last"):
        _positive(f"train.{key}", getattr(t, key))
    if t.batch_size % t.grad_accum != 0:
        raise ConfigError(f"train.batch_size={t.batch_size} must be divisible by train.grad_accum={t.grad_accum}")
    if t.seq_len > cfg.model.max_seq_len:
        raise ConfigError(f"train.seq_len={t.seq_len} must be <= model.max_seq_len={cfg.model.max_seq_len}")
    if t.stop_after is not None:
        _positive("train.stop_after", t.stop_after)
    _choice("train.dtype", t.dtype, ["fp32", "bf16"])
    _choice("logger.name", cfg.logger.name, ["wandb", "none"])
    validate_distributed(cfg)
    if cfg.logger.mode is not None:
        _choice("logger.mode", cfg.logger.mode, ["offline", "online", "disabled"])
    return cfg


def validate_distributed(cfg: Config) -> None:
    """The static checks of `distributed.*`; the world-size checks run at launch (moe/distributed/setup.py)."""
    d = cfg.distributed
    _choice("distributed.name", d.name, ["none", "ddp", "fsdp", "ep"])
    _choice("distributed.backend", d.backend, ["auto", "nccl", "gloo"])
    _choice("distributed.mixed_precision", d.mixed_precision, ["auto", "bf16", "fp32"])
    _positive("distributed.ep_size", d.ep_size)
    _positive("distributed.timeout_s", d.timeout_s)
    if d.name != "ep" and (d.ep_size != 1 or d.fsdp):
        raise ConfigError(f"distributed.ep_size={d.ep_size} / distributed.fsdp={d.fsdp} apply to distributed=ep "
                          f"only (distributed={d.name!r}); use distributed=ep distributed.ep_size=N")
    if d.name == "ep" and cfg.model.n_experts % d.ep_size != 0:
        raise ConfigError(f"model.n_experts={cfg.model.n_experts} must be divisible by distributed.ep_size="
                          f"{d.ep_size} (each expert-parallel rank holds n_experts / ep_size experts)")


def load_config(raw: Any) -> Config:
    """Merge a Hydra/OmegaConf/dict config onto the schema and validate it.

    Unknown keys and wrongly typed values become a ConfigError naming the key.
    """
    if isinstance(raw, Config):
        return validate(raw)
    if not isinstance(raw, DictConfig):
        raw = OmegaConf.create(raw)
    raw = OmegaConf.masked_copy(raw, [k for k in raw.keys() if k != "hydra"])
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), raw)
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        msg = str(e).splitlines()[0]
        if "not in" in msg or "Key" in msg and "not" in msg:
            raise ConfigError(f"unknown config key {key!r}: {msg}") from None
        raise ConfigError(f"bad value for {key!r}: {msg}") from None
    return validate(cfg)


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(d: dict) -> Config:
    return load_config(OmegaConf.create(d))
