"""Typed, validated configuration (a package: `schema.py` the dataclasses, `checks.py` the value
checks, `fields.py` field paths, `load.py` merging a Hydra config onto the schema): the schema of every training run, importing nothing from `moe`
but its error types.

Hydra composes YAML files from `configs/`; `load_config` merges the result onto these
dataclasses (so an unknown key is an error naming it) and `validate` checks the values (so
`top_k > n_experts` or a non-positive size is an error naming the field and what is allowed).
Each module owns its config: the model reads `ModelConfig`, the router `RouterConfig`, and so on.

The model config owns the model's variant choices (`model.router`, `model.attention`,
`model.experts`), so `Transformer(cfg.model)` needs nothing else. On the command line they stay
top-level Hydra groups for brevity (`router=switch router.top_k=1 experts=triton`):
`load_config` moves a top-level `router` / `attention` / `experts` section under `model`
(`nest_variant_groups`), which also reads the configs of checkpoints written before the move.

Variant *names* (`router.name`, `attention.name`, `experts.name`) are not checked here: the
registry that owns them checks them once, when the model is built (and `moe.variants.check`
does the same lookup at start-up, before data preparation).
"""

from moe.config.checks import (ROPE_SCALING_KEYS, check_context, validate, validate_cluster, validate_distributed,
                               validate_model, validate_rope_scaling)
from moe.config.fields import canonical_field, field_paths, is_field_or_section
from moe.config.load import from_dict, load_config, nest_variant_groups, to_dict
from moe.config.schema import (VARIANT_GROUPS, AttentionConfig, ClusterConfig, Config, DataConfig, DistributedConfig,
                               ExpertsConfig, LoggerConfig, ModelConfig, MonitorConfig, OptimConfig, RouterConfig,
                               TrainConfig)

__all__ = ["ROPE_SCALING_KEYS", "VARIANT_GROUPS", "AttentionConfig", "ClusterConfig", "Config", "DataConfig", "DistributedConfig",
           "ExpertsConfig", "LoggerConfig", "ModelConfig", "MonitorConfig", "OptimConfig", "RouterConfig",
           "TrainConfig", "canonical_field", "field_paths", "from_dict", "is_field_or_section", "load_config",
           "nest_variant_groups", "to_dict", "validate", "validate_cluster", "validate_distributed", "validate_model",
           "check_context", "validate_rope_scaling"]
