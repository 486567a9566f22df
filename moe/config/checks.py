"""Value checks of the config: each bad value is a ConfigError naming the field and what is allowed.
`choice`, `positive`, `in_range` and `index_list` are also what a variant's own Config checks with,
so every message has the same form."""

from __future__ import annotations

import math
import warnings
from typing import Any

from moe.config.fields import is_field_or_section
from moe.config.schema import VARIANT_GROUPS, ClusterConfig, Config, ModelConfig, TrainConfig
from moe.errors import ConfigError


def choice(name: str, value: Any, allowed) -> None:
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not allowed; choose one of {allowed}")


def positive(name: str, value: Any, allow_zero: bool = False) -> None:
    # `math.isfinite` also rejects nan (every comparison with it is False) and inf.
    ok = value is not None and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ConfigError(f"{name}={value!r} must be {'>= 0' if allow_zero else '> 0'} (and finite)")


def in_range(name: str, value: Any, low: float, high: float, ends: str = "[]") -> None:
    """`ends`: "[]" closed, "[)" / "(]" / "()" open at that end."""
    ok = value is not None and math.isfinite(value) and (value > low if ends[0] == "(" else value >= low) \
        and (value < high if ends[1] == ")" else value <= high)
    if not ok:
        raise ConfigError(f"{name}={value!r} must be in {ends[0]}{low}, {high}{ends[1]}")


def index_list(name: str, values: Any, n: int, n_name: str) -> None:
    """A list of distinct ints in [0, n)."""
    ok = isinstance(values, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    if not ok:
        raise ConfigError(f"{name}={values!r} must be a list of ints, e.g. {name}=[0,3]")
    bad = [v for v in values if not 0 <= v < n]
    if bad or len(set(values)) != len(values):
        raise ConfigError(f"{name}={list(values)!r} must hold distinct indices in [0, {n_name}={n})")


# The keys each HF `rope_type` reads (transformers' modeling_rope_utils), besides rope_type:
# (required, optional). `rope_theta` is model.rope_theta; partial rotary is not supported.
ROPE_SCALING_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ()),
    "yarn": (("factor", "original_max_position_embeddings"),
             ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), ()),
}


def validate_rope_scaling(s: Any) -> None:
    """`model.rope_scaling`: None (or {}) or a dict with a known rope_type and exactly the keys it reads."""
    if s is None:
        return
    if not isinstance(s, dict):
        raise ConfigError(f"model.rope_scaling={s!r} must be a dict such as {{rope_type: yarn, factor: 4.0, "
                          "original_max_position_embeddings: 32768}, or null for none")
    if not s:
        return
    choice("model.rope_scaling.rope_type", s.get("rope_type"), list(ROPE_SCALING_KEYS))
    required, optional = ROPE_SCALING_KEYS[s["rope_type"]]
    missing = [k for k in required if s.get(k) is None]
    unknown = sorted(set(s) - {"rope_type", *required, *optional})
    if missing or unknown:
        raise ConfigError(f"model.rope_scaling with rope_type={s['rope_type']!r} needs {list(required)}"
                          + (f" and may set {list(optional)}" if optional else "")
                          + (f"; missing {missing}" if missing else "") + (f"; unknown {unknown}" if unknown else ""))
    positive("model.rope_scaling.factor", s["factor"])
    if s["rope_type"] in ("linear", "dynamic") and s["factor"] < 1:
        raise ConfigError(f"model.rope_scaling.factor={s['factor']!r} must be >= 1 with rope_type={s['rope_type']!r}")
    for key in ("original_max_position_embeddings", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
                "attention_factor", "mscale", "mscale_all_dim"):
        if s.get(key) is not None:
            positive(f"model.rope_scaling.{key}", s[key])
    if s["rope_type"] == "llama3" and not s["low_freq_factor"] < s["high_freq_factor"]:
        raise ConfigError(f"model.rope_scaling.low_freq_factor={s['low_freq_factor']!r} must be < "
                          f"high_freq_factor={s['high_freq_factor']!r}")


def check_context(name: str, length: int, m: ModelConfig, allow: bool = False) -> None:
    """A context of `length` tokens (the field `name`) must fit the model's rotary: max_seq_len
    (the trained length) without rope scaling, `max_context` with it. Past that, attention sees
    positions it never saw and quality falls silently, so it is an error, not a warning; `allow`
    (the engine's allow_long_context, asked for explicitly) makes it a warning."""
    if length <= m.max_context:
        return
    if allow:
        warnings.warn(f"{name}={length} exceeds the model's context {m.max_context} (allowed explicitly): "
                      "positions beyond it were never trained", stacklevel=3)
        return
    if not m.rope_scaling:
        raise ConfigError(f"{name}={length} is beyond model.max_seq_len={m.max_seq_len} (the trained context) and "
                          "model.rope_scaling is not set; lower it, or set model.rope_scaling (e.g. {rope_type: "
                          f"yarn, factor: {-(-length // m.max_seq_len)}, original_max_position_embeddings: "
                          f"{m.max_seq_len}}})")
    raise ConfigError(f"{name}={length} is beyond the {m.max_context} tokens model.rope_scaling={m.rope_scaling} "
                      f"extends model.max_seq_len={m.max_seq_len} to; lower it or raise model.rope_scaling.factor")


LAYER_TYPES = ("full", "sliding")
EXPERT_ACTIVATIONS = ("swiglu", "clamped_swiglu")


def _check_attention_layout(m: ModelConfig) -> None:
    """`model.layer_types` names every layer full or sliding; a sliding layer needs a window, and
    a window needs a sliding layer (a window no layer reads would be silently ignored)."""
    if m.sliding_window is not None and (isinstance(m.sliding_window, bool) or not isinstance(m.sliding_window, int)
                                         or m.sliding_window < 1):
        raise ConfigError(f"model.sliding_window={m.sliding_window!r} must be an integer >= 1 (or null: no window)")
    if m.layer_types is None:
        return
    types = list(m.layer_types)
    if len(types) != m.n_layers:
        raise ConfigError(f"model.layer_types has {len(types)} entries; it needs one per layer "
                          f"(model.n_layers={m.n_layers}), each one of {list(LAYER_TYPES)}")
    for i, t in enumerate(types):
        if t not in LAYER_TYPES:
            raise ConfigError(f"model.layer_types[{i}]={t!r} is not allowed; choose one of {list(LAYER_TYPES)}")
    if "sliding" in types and m.sliding_window is None:
        raise ConfigError("model.layer_types has sliding layers but model.sliding_window is not set")
    if "sliding" not in types and m.sliding_window is not None:
        raise ConfigError(f"model.sliding_window={m.sliding_window} has no effect: model.layer_types has no "
                          "'sliding' layer (set model.layer_types=null to make every layer sliding)")


MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _check_mla(m: ModelConfig) -> None:
    """`model.attention_kind`: MLA needs its sizes and takes none of the options it has no place for
    (each a ConfigError naming both fields); the MLA sizes without MLA would be silently ignored."""
    choice("model.attention_kind", m.attention_kind, ["mha", "mla"])
    if m.attention_kind != "mla":
        for key in (k for k in MLA_FIELDS if getattr(m, k) is not None):
            raise ConfigError(f"model.{key}={getattr(m, key)!r} is an MLA size: it needs model.attention_kind=mla "
                              f"(model.attention_kind={m.attention_kind!r})")
        if m.rope_interleave:
            raise ConfigError("model.rope_interleave=true needs model.attention_kind=mla (the MLA rotary key)")
        return
    for key in MLA_FIELDS[1:]:
        positive(f"model.{key}", getattr(m, key))
    if m.q_lora_rank is not None:
        positive("model.q_lora_rank", m.q_lora_rank)
    if m.qk_rope_head_dim % 2 != 0:
        raise ConfigError(f"model.qk_rope_head_dim={m.qk_rope_head_dim} must be even for rotary embeddings")
    windows = [m.layer_window(i) for i in range(m.n_layers)]
    conflicts = [
        (m.n_kv_heads != m.n_heads, f"model.n_kv_heads={m.n_kv_heads}",
         f"MLA gives every head its own key and value (set model.n_kv_heads=model.n_heads={m.n_heads})"),
        (m.attention.name == "flash", "attention=flash", "flash-attn needs one head dim for q, k and v; use sdpa"),
        (any(w is not None for w in windows), f"model.sliding_window={m.sliding_window}", "MLA layers are full attention"),
        (m.attention_sinks, "model.attention_sinks=true", "MLA has no attention sinks"),
        (m.head_dim is not None, f"model.head_dim={m.head_dim}", "MLA's head widths are qk_nope/qk_rope/v_head_dim"),
        (m.qk_norm != "none", f"model.qk_norm={m.qk_norm!r}", "MLA normalises its latents instead"),
        (m.clip_qkv is not None, f"model.clip_qkv={m.clip_qkv}", "MLA does not clip q/k/v"),
        (m.qkv_bias or m.attn_out_bias, "model.qkv_bias / model.attn_out_bias", "MLA's projections have no biases"),
    ]
    for bad, option, why in conflicts:
        if bad:
            raise ConfigError(f"model.attention_kind='mla' cannot take {option}: {why}")


def _check_expert_options(m: ModelConfig) -> None:
    choice("model.expert_activation", m.expert_activation, list(EXPERT_ACTIVATIONS))
    positive("model.swiglu_alpha", m.swiglu_alpha)
    positive("model.swiglu_limit", m.swiglu_limit)


def validate_model(m: ModelConfig) -> None:
    """Check the model's settings, and its variants' options where they are resolved (the variant's
    own Config checks them, `check_model`); variant names are the registries' to check."""
    for key in ("d_model", "n_layers", "n_heads", "n_kv_heads", "max_seq_len", "n_experts",
                "expert_hidden", "rope_theta", "norm_eps", "init_std"):
        positive(f"model.{key}", getattr(m, key))
    for key in ("n_shared_experts", "n_dense_layers", "mtp_depth"):
        positive(f"model.{key}", getattr(m, key), allow_zero=True)
    for key in ("vocab_size", "head_dim", "dense_hidden", "shared_expert_hidden", "clip_qkv"):
        if getattr(m, key) is not None:
            positive(f"model.{key}", getattr(m, key))
    choice("model.qk_norm", m.qk_norm, ["none", "full", "head"])
    _check_attention_layout(m)
    _check_mla(m)
    positive("model.routed_scaling_factor", m.routed_scaling_factor)
    _check_expert_options(m)
    validate_rope_scaling(m.rope_scaling)
    for key in ("shared_expert_hidden", "shared_expert_gate"):
        if getattr(m, key) not in (None, False) and m.n_shared_experts == 0:
            raise ConfigError(f"model.{key}={getattr(m, key)!r} needs a shared expert (model.n_shared_experts >= 1)")
    index_list("model.dense_layers", m.dense_layers, m.n_layers, "model.n_layers")
    if m.n_heads % m.n_kv_heads != 0:
        raise ConfigError(
            f"model.n_heads={m.n_heads} must be divisible by model.n_kv_heads={m.n_kv_heads} "
            f"(grouped-query attention shares each kv head among n_heads / n_kv_heads heads)")
    if m.head_dim is None and m.attention_kind == "mha" and m.d_model % m.n_heads != 0:
        raise ConfigError(f"model.d_model={m.d_model} must be divisible by model.n_heads={m.n_heads} "
                          "(or set model.head_dim)")
    if m.attention_kind == "mha" and m.resolved_head_dim % 2 != 0:
        raise ConfigError(f"head dim {m.resolved_head_dim} must be even for rotary embeddings")
    if m.n_dense_layers > m.n_layers:
        raise ConfigError(f"model.n_dense_layers={m.n_dense_layers} must be <= model.n_layers={m.n_layers}")
    for group in VARIANT_GROUPS:  # a variant's own options check themselves against the model (see VariantConfig)
        check = getattr(getattr(m, group), "check_model", None)
        if check is not None:
            check(m)


def validate(cfg: Config) -> Config:
    """Raise ConfigError naming the first bad field; return cfg unchanged otherwise."""
    validate_model(cfg.model)
    d = cfg.data
    choice("data.name", d.name, ["pystdlib", "text", "hub", "chat"])
    if d.name == "chat" and not (d.path or d.hub_name):
        raise ConfigError("data=chat needs data.path (.jsonl / .json / .parquet chat files) or data.hub_name")
    if d.name == "text" and not d.path:
        raise ConfigError("data.path is required with data=text (a file, a glob or a list)")
    if d.name == "hub" and not d.hub_name:
        raise ConfigError("data.hub_name is required with data=hub (e.g. roneneldan/TinyStories)")
    positive("data.vocab_size", d.vocab_size)
    if d.vocab_size < 300 and d.tokenizer_path is None:
        raise ConfigError(f"data.vocab_size={d.vocab_size} must be >= 300 (256 bytes + special tokens + merges)")
    positive("data.tokenizer_train_chars", d.tokenizer_train_chars)
    if d.num_proc is not None:
        positive("data.num_proc", d.num_proc)
    positive("data.shard_tokens", d.shard_tokens)
    if d.max_chars is not None:
        positive("data.max_chars", d.max_chars)
    if not d.text_field:
        raise ConfigError("data.text_field must name the column holding the text (e.g. 'text')")
    in_range("data.val_fraction", d.val_fraction, 0.0, 1.0, "()")
    o = cfg.optim
    choice("optim.name", o.name, ["adamw"])
    choice("optim.impl", o.impl, ["auto", "fused", "foreach", "for_loop"])
    positive("optim.lr", o.lr)
    positive("optim.warmup_steps", o.warmup_steps, allow_zero=True)
    positive("optim.grad_clip", o.grad_clip, allow_zero=True)
    in_range("optim.min_lr_ratio", o.min_lr_ratio, 0.0, 1.0)
    positive("optim.weight_decay", o.weight_decay, allow_zero=True)
    in_range("optim.beta1", o.beta1, 0.0, 1.0, "[)")
    in_range("optim.beta2", o.beta2, 0.0, 1.0, "[)")
    positive("optim.eps", o.eps)
    t = cfg.train
    for key in ("batch_size", "seq_len", "grad_accum", "max_steps", "log_interval",
                "eval_interval", "eval_batches", "ckpt_interval", "keep_last"):
        positive(f"train.{key}", getattr(t, key))
    if t.batch_size % t.grad_accum != 0:
        raise ConfigError(f"train.batch_size={t.batch_size} must be divisible by train.grad_accum={t.grad_accum}")
    check_context("train.seq_len", t.seq_len, cfg.model)
    if t.stop_after is not None:
        positive("train.stop_after", t.stop_after)
    if t.peak_flops is not None:
        positive("train.peak_flops", t.peak_flops)
    for name in (n for n in t.resume_allow if not is_field_or_section(str(n))):
        raise ConfigError(f"train.resume_allow: {name!r} is not a config field or section (e.g. train.max_steps, optim)")
    in_range("seed", cfg.seed, 0, 2**32 - 1)  # numpy's seed range
    choice("train.dtype", t.dtype, ["auto", "fp32", "bf16"])
    if not isinstance(t.tf32, bool):
        raise ConfigError(f"train.tf32={t.tf32!r} must be true or false")
    choice("train.activation_checkpointing", t.activation_checkpointing, ["none", "full"])
    if t.compile and t.activation_checkpointing != "none":
        # Dynamo cannot trace the checkpoint's context_fn (moe/train/activation_checkpointing.py restores
        # router buffers after the recomputation with one): "checkpoint not implemented for ... context_fn".
        raise ConfigError(f"train.activation_checkpointing={t.activation_checkpointing!r} does not work with "
                          "train.compile=true yet; use one or the other")
    validate_profile(t)
    validate_mtp(cfg)
    choice("logger.name", cfg.logger.name, ["wandb", "none"])
    # Monitor thresholds: 0 turns a check off (token_entropy_high: any value above 1 does).
    mon = cfg.monitor
    for key in ("dead_experts", "load_imbalance_high", "start_step"):
        positive(f"monitor.{key}", getattr(mon, key), allow_zero=True)
    in_range("monitor.load_entropy_low", mon.load_entropy_low, 0.0, 1.0, "[)")
    positive("monitor.token_entropy_high", mon.token_entropy_high)
    positive("monitor.patience", mon.patience)  # 0 would never warn
    validate_distributed(cfg)
    validate_cluster(cfg.cluster)
    if cfg.logger.mode is not None:
        choice("logger.mode", cfg.logger.mode, ["offline", "online", "disabled"])
    return cfg


def validate_profile(t: TrainConfig) -> None:
    """`train.profile.*`: counts, and (when enabled) a window that ends within train.max_steps."""
    p = t.profile
    for key in ("wait", "warmup", "repeat"):
        positive(f"train.profile.{key}", getattr(p, key), allow_zero=True)
    for key in ("active", "top_ops"):
        positive(f"train.profile.{key}", getattr(p, key))
    cycle = p.wait + p.warmup + p.active
    end = cycle * max(p.repeat, 1)  # repeat=0 cycles until the end: its first window must fit
    if p.enabled and end > t.max_steps:
        times = f" x train.profile.repeat={p.repeat}" if p.repeat > 1 else ""
        raise ConfigError(f"train.profile: the window (wait={p.wait} + warmup={p.warmup} + active={p.active}{times}) "
                          f"ends at step {end}, past train.max_steps={t.max_steps}; lower train.profile.wait / "
                          "warmup / active / repeat or raise train.max_steps")


def validate_mtp(cfg: Config) -> None:
    """The MTP loss settings against model.mtp_depth: a coefficient without modules cannot work (one
    error); modules trained with coefficient 0 (the default) learn nothing, which is allowed (a
    model can carry untrained modules, e.g. to train them later) and warned about by the trainer."""
    t = cfg.train
    positive("train.mtp_loss_coef", t.mtp_loss_coef, allow_zero=True)
    if t.mtp_loss_coef_after is not None:
        positive("train.mtp_loss_coef_after", t.mtp_loss_coef_after, allow_zero=True)
    if t.mtp_loss_switch_step is not None:
        positive("train.mtp_loss_switch_step", t.mtp_loss_switch_step)
    if (t.mtp_loss_coef_after is None) != (t.mtp_loss_switch_step is None):
        raise ConfigError(f"train.mtp_loss_coef_after={t.mtp_loss_coef_after} and train.mtp_loss_switch_step="
                          f"{t.mtp_loss_switch_step} go together: set both (the coefficient from that step on) or neither")
    if cfg.model.mtp_depth > 0 and cfg.data.name == "chat" and getattr(cfg.data, "packing", False):
        # The MTP blocks attend (and shift their targets) across a packed row's conversations.
        raise ConfigError(f"model.mtp_depth={cfg.model.mtp_depth} is not supported with data.packing=true: the MTP "
                          "modules take no document mask yet; use data.packing=false or model.mtp_depth=0")
    if cfg.model.mtp_depth == 0 and (t.mtp_loss_coef > 0 or (t.mtp_loss_coef_after or 0) > 0):
        raise ConfigError(f"train.mtp_loss_coef={t.mtp_loss_coef} needs MTP modules: set model.mtp_depth >= 1 "
                          "(e.g. model.mtp_depth=1) or train.mtp_loss_coef=0")


def validate_distributed(cfg: Config) -> None:
    """The static checks of `distributed.*`; the world-size checks run at launch (moe/distributed/setup.py)."""
    d = cfg.distributed
    choice("distributed.name", d.name, ["none", "ddp", "fsdp", "ep"])
    choice("distributed.backend", d.backend, ["auto", "nccl", "gloo"])
    choice("distributed.mixed_precision", d.mixed_precision, ["auto", "bf16", "fp32"])
    positive("distributed.ep_size", d.ep_size)
    positive("distributed.timeout_s", d.timeout_s)
    positive("distributed.ep_grad_bucket_mb", d.ep_grad_bucket_mb, allow_zero=True)
    if d.name != "ep" and (d.ep_size != 1 or d.fsdp):
        raise ConfigError(f"distributed.ep_size={d.ep_size} / distributed.fsdp={d.fsdp} apply to distributed=ep "
                          f"only (distributed={d.name!r}); use distributed=ep distributed.ep_size=N")
    if d.name == "ep" and cfg.model.n_experts % d.ep_size != 0:
        raise ConfigError(f"model.n_experts={cfg.model.n_experts} must be divisible by distributed.ep_size="
                          f"{d.ep_size} (each expert-parallel rank holds n_experts / ep_size experts)")


def validate_cluster(c: ClusterConfig) -> None:
    """The static checks of `cluster.*` (what the job's processes must agree with, `distributed.*` and the
    batch, is checked by the launcher before it submits: moe/cluster/launcher.py)."""
    for key in ("nodes", "tasks_per_node", "cpus_per_task", "timeout_min"):
        positive(f"cluster.{key}", getattr(c, key))
    for key in ("gpus_per_node", "max_requeues", "signal_delay_s"):
        positive(f"cluster.{key}", getattr(c, key), allow_zero=True)
    if c.mem_gb is not None:
        positive("cluster.mem_gb", c.mem_gb)
    if c.signal_delay_s >= 60 * c.timeout_min:
        raise ConfigError(f"cluster.signal_delay_s={c.signal_delay_s} must be shorter than the time limit "
                          f"cluster.timeout_min={c.timeout_min} minutes (the job would be signalled before it starts)")
    if not all(isinstance(line, str) for line in c.setup):
        raise ConfigError(f"cluster.setup={c.setup!r} must be a list of shell lines (strings)")
