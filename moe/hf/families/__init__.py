"""The pretrained families, one module each, registered by HF `model_type` in `FAMILIES`
(see `base.py`): gpt_oss, mixtral, olmoe, qwen2_moe, qwen3_moe."""

from moe.hf.families.base import FAMILIES, Family
from moe.hf.families import gpt_oss, mixtral, olmoe, qwen2_moe, qwen3_moe  # noqa: F401  (register the families)

__all__ = ["FAMILIES", "Family", "family"]


def family(model_type: str) -> Family:
    """The family registered as `model_type` (a ConfigError listing the known ones otherwise)."""
    return FAMILIES.get(model_type)()
