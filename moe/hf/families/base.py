"""What a pretrained model family is to the converters (`Family`), and the registry of them.

A family (one HF `model_type`) says three things:

* how its HF config maps to our `ModelConfig` (`model_config`) and back (`hf_fields`); every
  field of its config is either read (`mapped`), known to have no effect on the model's outputs
  at inference (`ignored`, with the reason), or generic to every transformers config
  (`BASE_FIELDS`: names, dtype, output flags). A field in none of these is refused by
  `check_fields` with a ConfigError naming it: a converter never ignores what it does not know;
* which of our options it cannot express (`refusals`: a ConfigError naming the option);
* the names of its tensors on disk (`moe_module`, `expert_names`; the rest of the naming is
  shared by all four families, `moe/hf/tensor_map.py`).

The families register under their `model_type` in `FAMILIES` (`moe/hf/families/<model_type>.py`).
"""

from __future__ import annotations

from typing import Any, Optional

from transformers import PretrainedConfig

from moe.config import (ROPE_SCALING_KEYS, AttentionConfig, ExpertsConfig, ModelConfig, validate_model,
                        validate_rope_scaling)
from moe.errors import ConfigError
from moe.registry import Registry
from moe.routing.routers import router_config

# Fields every transformers config has (names, dtype, output switches): none changes the math.
BASE_FIELDS = frozenset(PretrainedConfig().to_dict())
# Fields of the four families that never change a forward pass at inference.
COMMON_IGNORED = {
    "bos_token_id": "token ids: the tokenizer and generation_config.json carry them",
    "eos_token_id": "token ids: the tokenizer and generation_config.json carry them",
    "pad_token_id": "token ids (HF's embedding padding_idx only affects training gradients)",
    "use_cache": "HF's KV-cache switch; the engine has its own cache",
    "output_router_logits": "HF returns router logits (and adds its balance loss) when set; no effect on logits",
}
# Fields read by every family's `common_model_fields` / `common_hf_fields`.
COMMON_MAPPED = frozenset({
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "max_position_embeddings", "rope_parameters", "rms_norm_eps", "tie_word_embeddings", "initializer_range",
    "num_experts_per_tok", "router_aux_loss_coef", "hidden_act", "attention_dropout", "head_dim",
})


class Family:
    model_type: str = ""
    display_name: str = ""  # for messages, e.g. "Qwen3-MoE"
    architecture: str = ""  # the `architectures` entry of config.json, e.g. "OlmoeForCausalLM"
    config_class: type[PretrainedConfig] = PretrainedConfig
    moe_module: str = "mlp"  # on-disk name of a layer's MoE block (Mixtral: block_sparse_moe)
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")  # gate, up, down on disk
    window_support: str = "none"  # sliding-window layers: none | uniform | per_layer (feature_refusals)
    expert_layout: str = "per_expert"  # hub files: one tensor per expert | "fused" (GPT-OSS, moe/hf/tensor_map.py)
    shared_module: str = "shared_expert"  # on-disk name of the shared-expert FFN (DeepSeek: shared_experts)
    head_dim_field: str = "when_different"  # write head_dim to the HF config: when_different (from hidden / heads) | never
    mapped: frozenset = frozenset()  # fields this family reads besides COMMON_MAPPED
    unwritten: frozenset = frozenset()  # common fields its HF config does not have (DeepSeek: router_aux_loss_coef)
    ignored: dict = {}  # fields besides COMMON_IGNORED that change nothing at inference, with why

    # ------------------------------------------------------------------ to implement
    def model_fields(self, c: PretrainedConfig) -> dict[str, Any]:
        """The family-specific ModelConfig fields (and router `renormalize`) of HF config `c`."""
        raise NotImplementedError

    def hf_fields(self, m: ModelConfig) -> dict[str, Any]:
        """The family-specific HF config fields of our `m` (already checked by `refusals`)."""
        raise NotImplementedError

    def refusals(self, m: ModelConfig) -> list[tuple[bool, str, Any, str]]:
        """(refused?, option, value, why) for our options this family cannot express."""
        raise NotImplementedError

    def stored_mtp_depth(self, c: PretrainedConfig, stored_names: set) -> int:
        """How many multi-token-prediction layers the checkpoint files hold (DeepSeek-V3 stores
        them; transformers' models drop them, so only a directory's files can tell)."""
        return 0

    def feature_refusals(self, m: ModelConfig) -> list[tuple[bool, str, Any, str]]:
        """Refusals of the per-layer attention and GPT-OSS options, by `window_support`: "none"
        (no sliding layer), "uniform" (one window on every layer, Mixtral) or "per_layer"."""
        windows = [m.layer_window(i) for i in range(m.n_layers)]
        name = self.display_name
        return [
            (self.window_support == "none" and any(w is not None for w in windows), "model.sliding_window",
             m.sliding_window, f"{name} attention is full causal attention"),
            (self.window_support == "uniform" and len(set(windows)) > 1, "model.layer_types", m.layer_types,
             f"{name}'s sliding_window applies to every layer alike"),
            (m.attention_sinks, "model.attention_sinks", m.attention_sinks, f"{name} has no attention sinks"),
            (m.router_bias, "model.router_bias", m.router_bias, f"{name}'s router has no bias"),
            (m.expert_bias, "model.expert_bias", m.expert_bias, f"{name}'s experts have no biases"),
            (m.expert_activation != "swiglu", "model.expert_activation", m.expert_activation,
             f"{name}'s experts are plain SwiGLU"),
        ]

    def stored_pieces(self, pieces, kept: bool = False):
        """The stream of stored (name, reader) pairs as the tensor map names them: unchanged, or
        with packed formats unpacked (GPT-OSS's MXFP4 experts) unless they are `kept` quantized."""
        return pieces

    # ------------------------------------------------------------------ checkpoints stored quantized
    def kept_quantization(self, c: PretrainedConfig, spec: Any) -> bool:
        """Whether the checkpoint of HF config `c` stores its weights in the format of `spec` (a
        `moe.quant.QuantSpec`), so that they load as stored, never re-quantized (GPT-OSS: MXFP4)."""
        return False

    def kept_route(self, route):
        """The load route (moe/hf/tensor_map.py) with the stored quantized tensors placed into the
        quantized modules' buffers (used when `kept_quantization`)."""
        return route

    def kept_tensors(self, state: dict, hf_name: str, our_name: str) -> Optional[dict]:
        """On export, the stored-format tensors of `our_name` when `state` holds it quantized in the
        family's own format (GPT-OSS: `<hf_name>_blocks` / `_scales`), else None."""
        return None

    def export_quantization(self, config: PretrainedConfig, spec: Any) -> None:
        """Set (or drop) `config.quantization_config` for weights exported quantized per `spec` (None:
        full precision). Families without a stored quantized format refuse a quantized model earlier."""

    def tensor_transform(self, hf_name: str):
        """(to_ours, to_hf) for an HF tensor stored in another layout than ours, else None."""
        return None

    def input_refusals(self, c: PretrainedConfig) -> list[tuple[bool, str, Any, str]]:
        """(refused?, field, value, why) for values of mapped HF fields our model cannot run."""
        return []

    # ------------------------------------------------------------------ HF config -> ours
    def check_fields(self, c: PretrainedConfig) -> None:
        known = BASE_FIELDS | COMMON_MAPPED | self.mapped | set(COMMON_IGNORED) | set(self.ignored)
        unknown = sorted(set(c.to_dict()) - known)
        if unknown:
            raise ConfigError(f"{type(c).__name__} field(s) {unknown} are not known to the {self.model_type} "
                              "converter, which refuses rather than ignores what may change the model's outputs")

    def model_config(self, c: PretrainedConfig, attention: str = "sdpa", experts: str = "sorted") -> ModelConfig:
        """Our ModelConfig (router included) of HF config `c`; a ConfigError names any field
        that our model cannot reproduce or that the converter does not know."""
        self.check_fields(c)
        for refused, option, value, why in common_input_refusals(c) + self.input_refusals(c):
            if refused:
                raise ConfigError(f"{type(c).__name__}.{option}={value!r} is not supported: {why}")
        fields = self.model_fields(c)
        router = self.router_config(c, fields)
        cfg = ModelConfig(**{**common_model_fields(c), **fields}, router=router,
                          attention=AttentionConfig(name=attention), experts=ExpertsConfig(name=experts))
        validate_model(cfg)
        return cfg

    def router_config(self, c: PretrainedConfig, fields: dict[str, Any]):
        """The router of HF config `c` (`fields`: `model_fields`' result, whose `renormalize` it
        takes): softmax top-k; DeepSeek's families choose theirs."""
        return router_config("topk", top_k=c.num_experts_per_tok, renormalize=fields.pop("renormalize"),
                             aux_loss_coef=c.router_aux_loss_coef, z_loss_coef=0.0, temperature=1.0, jitter=0.0,
                             capacity_factor=None)

    def router_refusals(self, m: ModelConfig) -> list[tuple[bool, str, Any, str]]:
        """(refused?, option, value, why) for router options this family cannot express."""
        return common_refusals(m)

    # ------------------------------------------------------------------ ours -> HF config
    def check_expressible(self, m: ModelConfig) -> None:
        """Raise a ConfigError naming the first option of `m` this family cannot express."""
        for refused, option, value, why in self.router_refusals(m) + self.feature_refusals(m) + self.refusals(m):
            if refused:
                raise ConfigError(f"{option}={value!r} cannot be expressed as a {self.display_name} model: {why}")

    def hf_config(self, m: ModelConfig, base: Optional[dict] = None, **extra: Any) -> PretrainedConfig:
        """The HF config of a model built from `m`. `base` (the HF config an imported model came
        with) supplies the fields we do not derive (token ids, ...); `extra` overrides those too
        (special token ids, `attn_implementation`) but may not set a derived field."""
        self.check_expressible(m)
        validate_model(m)
        if m.vocab_size is None:
            raise ConfigError("model.vocab_size=None: set it (the tokenizer's size) before converting")
        derived = {k: v for k, v in {**common_hf_fields(m, self.head_dim_field), **self.hf_fields(m)}.items()
                   if k not in self.unwritten}
        canon = self.config_class.attribute_map
        derived = {canon.get(k, k): v for k, v in derived.items()}
        clash = sorted(set(extra) & set(derived))
        if clash:
            raise ConfigError(f"extra HF config option(s) {clash} are derived from the model config; "
                              "change the ModelConfig/RouterConfig instead")
        kwargs: dict[str, Any] = {k: None for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        kwargs.update({canon.get(k, k): v for k, v in (base or {}).items()
                       if k not in BASE_FIELDS or k in ("bos_token_id", "eos_token_id", "pad_token_id")})
        kwargs.update(derived)
        kwargs.update(extra)
        config = self.config_class(**kwargs)
        config.architectures = [self.architecture]
        return config


FAMILIES: Registry[type[Family]] = Registry("model_type", package="moe.hf.families")


# ---------------------------------------------------------------------------- shared mapping

def rope_fields(c: PretrainedConfig) -> dict[str, Any]:
    """`rope_theta` and `rope_scaling` (our ModelConfig fields) of HF's `rope_parameters`: the
    plain rotary (rope_type default) or one of the scalings `moe/rope.py` implements (linear,
    dynamic, yarn, llama3), with exactly the keys that type reads. Partial rotary is refused."""
    params = dict(c.rope_parameters or {})
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    partial = params.pop("partial_rotary_factor", 1.0)
    if partial not in (None, 1, 1.0):
        raise ConfigError(f"rope_parameters.partial_rotary_factor={partial!r} is not supported: our "
                          "rotary covers the whole head dim")
    theta = params.pop("rope_theta", getattr(c, "rope_theta", None))
    if theta is None:
        raise ConfigError("rope_parameters.rope_theta is missing")
    if rope_type == "default":
        if params:
            raise ConfigError(f"rope_parameters keys {sorted(params)} are not supported with rope_type='default'")
        return dict(rope_theta=float(theta), rope_scaling=None)
    if rope_type not in ROPE_SCALING_KEYS:
        raise ConfigError(f"rope_parameters.rope_type={rope_type!r} is not supported; moe-lab's rotary "
                          f"implements {['default', *ROPE_SCALING_KEYS]}")
    scaling = {"rope_type": rope_type, **params}
    try:
        validate_rope_scaling(scaling)
    except ConfigError as e:
        raise ConfigError(f"rope_parameters: {e}") from None
    return dict(rope_theta=float(theta), rope_scaling=scaling)


def hf_rope_parameters(m: ModelConfig) -> dict[str, Any]:
    """HF's `rope_parameters` of our config (the inverse of `rope_fields`)."""
    scaling = dict(m.rope_scaling or {})
    return {"rope_type": scaling.pop("rope_type", "default"), "rope_theta": float(m.rope_theta), **scaling}


def hf_head_dim(c: PretrainedConfig) -> int:
    """The head dim HF's attention uses: `getattr(config, "head_dim", hidden // heads)`, as written."""
    return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


def common_model_fields(c: PretrainedConfig) -> dict[str, Any]:
    head_dim = hf_head_dim(c)
    return dict(
        vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads or c.num_attention_heads,
        head_dim=None if head_dim == c.hidden_size // c.num_attention_heads else head_dim,
        max_seq_len=c.max_position_embeddings, **rope_fields(c), norm_eps=c.rms_norm_eps,
        tie_embeddings=bool(c.tie_word_embeddings), init_std=c.initializer_range)


def common_hf_fields(m: ModelConfig, head_dim_field: str) -> dict[str, Any]:
    fields = dict(
        vocab_size=m.vocab_size, hidden_size=m.d_model, num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads, num_key_value_heads=m.n_kv_heads, max_position_embeddings=m.max_seq_len,
        rope_parameters=hf_rope_parameters(m), rms_norm_eps=m.norm_eps,
        tie_word_embeddings=m.tie_embeddings, initializer_range=m.init_std, num_experts_per_tok=m.router.top_k,
        router_aux_loss_coef=m.router.aux_loss_coef, hidden_act="silu", attention_dropout=0.0)
    # HF's dynamic / yarn frequencies read `config.head_dim` without falling back when it is None
    # (transformers 5.24), so a scaled rotary writes it even when it equals hidden / heads.
    if head_dim_field == "when_different" and (m.head_dim not in (None, m.d_model // m.n_heads) or m.rope_scaling):
        fields["head_dim"] = m.resolved_head_dim
    return fields


def common_input_refusals(c: PretrainedConfig) -> list[tuple[bool, str, Any, str]]:
    return [
        (c.hidden_act != "silu", "hidden_act", c.hidden_act, "our experts and dense FFNs are SwiGLU (silu)"),
        (c.attention_dropout != 0, "attention_dropout", c.attention_dropout, "our attention has no dropout"),
    ]


def common_refusals(m: ModelConfig) -> list[tuple[bool, str, Any, str]]:
    r = m.router
    return [
        (r.name != "topk", "router.name", r.name, "HF routes with softmax top-k ('topk')"),
        (getattr(r, "score_func", "softmax") != "softmax", "router.score_func", getattr(r, "score_func", None),
         "HF scores experts with a softmax"),
        (r.temperature != 1, "router.temperature", r.temperature, "HF's router has no temperature"),
        (getattr(r, "n_groups", 1) > 1, "router.n_groups", getattr(r, "n_groups", 1), "HF has no group-limited routing"),
        (r.capacity_factor is not None, "router.capacity_factor", r.capacity_factor,
         "HF is dropless, so inference would differ from ours"),
        (bool(r.drop_experts), "router.drop_experts", list(r.drop_experts),
         "an inference-time ablation HF configs cannot state"),
        (m.mtp_depth > 0, "model.mtp_depth", m.mtp_depth, "the family has no multi-token-prediction layers, and "
         "dropping trained ones silently would lose the model's own drafter (moe/mtp.py)"),
        (m.attention_kind != "mha", "model.attention_kind", m.attention_kind,
         "its attention is grouped-query attention (MLA: the deepseek_v2 / deepseek_v3 families)"),
        (m.routed_scaling_factor != 1, "model.routed_scaling_factor", m.routed_scaling_factor,
         "it does not scale its routed experts"),
    ]


def dense_layout(dense_ids: list[int], n_layers: int) -> tuple[int, list[int]]:
    """Qwen's (decoder_sparse_step, mlp_only_layers) for a set of dense layers: layer i is MoE
    when (i + 1) % step == 0 and i is not in mlp_only_layers. The step that leaves the fewest
    explicit layers (then the smallest) is chosen, so HF -> ours -> HF gives back HF's layout."""
    dense = set(dense_ids)
    best = (1, sorted(dense))
    for step in range(2, n_layers + 1):
        off_step = {i for i in range(n_layers) if (i + 1) % step != 0}
        if off_step <= dense and len(dense - off_step) < len(best[1]):
            best = (step, sorted(dense - off_step))
    return best


def dense_ids_of(step: int, mlp_only_layers: list[int], n_layers: int) -> list[int]:
    """The dense layers of Qwen's layout (the inverse of `dense_layout`)."""
    return sorted({i for i in range(n_layers) if (i + 1) % step != 0} | {int(i) for i in mlp_only_layers})


def layer_fields(c: PretrainedConfig) -> dict[str, Any]:
    """Our `layer_types` / `sliding_window` of HF's `layer_types` (full_attention /
    sliding_attention) and `sliding_window`: None / None when no layer slides."""
    types = [{"full_attention": "full", "sliding_attention": "sliding"}[t] for t in c.layer_types]
    if "sliding" not in types:
        return dict(layer_types=None, sliding_window=None)
    if not c.sliding_window:
        raise ConfigError(f"{type(c).__name__}.layer_types has sliding_attention layers but "
                          f"sliding_window={c.sliding_window!r}")
    return dict(layer_types=types, sliding_window=int(c.sliding_window))


def hf_layer_fields(m: ModelConfig) -> dict[str, Any]:
    """HF's `layer_types`, `sliding_window` and `use_sliding_window` of our config (the inverse of
    `layer_fields`); HF reads the explicit types, so `max_window_layers` is not derived."""
    windows = [m.layer_window(i) for i in range(m.n_layers)]
    sliding = any(w is not None for w in windows)
    return dict(layer_types=["full_attention" if w is None else "sliding_attention" for w in windows],
                sliding_window=m.sliding_window if sliding else None, use_sliding_window=sliding)
