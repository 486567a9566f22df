"""Typed, validated configuration (a package: `schema.py` the dataclasses, `checks.py` the value
checks, `fields.py` field paths, `load.py` merging a Hydra config onto the schema): the schema of every training run, importing nothing from `moe`
but its error types.

Hydra composes YAML files from `configs/`; `load_config` merges the result onto these
dataclasses (so an unknown key is an error naming it) and `validate` checks the values (so
`top_k > n_experts` or a non-positive size is an error naming the field and what is allowed).
Each module owns its config: the model reads `ModelConfig`, the trainer `TrainConfig`, and so on;
a variant owns its options (a router's `Config` lives with the router, moe/routing/routers/).

The model config owns the model's variant choices (`model.router`, `model.attention`,
`model.experts`), so `Transformer(cfg.model)` needs nothing else. On the command line they stay
top-level Hydra groups for brevity (`router=switch router.top_k=1 experts=triton`):
`load_config` moves a top-level `router` / `attention` / `experts` section under `model`
(`nest_variant_groups`), which also reads the configs of checkpoints written before the move.

Variant *names* and *options* are not checked here: the schema knows no variant, so a variant
section is a `VariantConfig` (a name and the options given). `moe.variants` (above the variants)
resolves it: the registry checks the name and merges the options onto the variant's own Config,
which refuses an option the variant does not have. `moe.variants.load_config` / `from_dict` are
this package's `load_config` / `from_dict` followed by that step: what entry points use.
"""

from moe.config.checks import (ROPE_SCALING_KEYS, check_context, choice, in_range, index_list, positive, validate,
                               validate_cluster, validate_distributed, validate_model, validate_rope_scaling)
from moe.config.fields import canonical_field, field_paths, is_field_or_section
from moe.config.load import from_dict, load_config, nest_variant_groups, to_dict, variant_dict
from moe.config.schema import (VARIANT_GROUPS, AttentionConfig, ClusterConfig, Config, DataConfig, DistributedConfig,
                               ExpertsConfig, LoggerConfig, ModelConfig, MonitorConfig, OptimConfig, TrainConfig,
                               VariantConfig)

__all__ = ["ROPE_SCALING_KEYS", "VARIANT_GROUPS", "AttentionConfig", "ClusterConfig", "Config", "DataConfig",
           "DistributedConfig", "ExpertsConfig", "LoggerConfig", "ModelConfig", "MonitorConfig", "OptimConfig",
           "TrainConfig", "VariantConfig", "canonical_field", "check_context", "choice", "field_paths", "from_dict",
           "in_range", "index_list", "is_field_or_section", "load_config", "nest_variant_groups", "positive", "to_dict",
           "validate", "validate_cluster", "validate_distributed", "validate_model", "validate_rope_scaling",
           "variant_dict"]
