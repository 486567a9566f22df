"""The pretrained families, one module each (`<model_type>.py`), registered by HF `model_type` in
`FAMILIES`, which imports every module of this package when first asked (see `base.py`)."""

from moe.hf.families.base import FAMILIES, Family

__all__ = ["FAMILIES", "Family", "family"]


def family(model_type: str) -> Family:
    """The family registered as `model_type` (a ConfigError listing the known ones otherwise)."""
    return FAMILIES.get(model_type)()
