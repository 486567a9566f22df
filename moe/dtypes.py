"""The one table of dtype names accepted on command lines and in configs.

Imports nothing from `moe` (only torch and the error types), so configs, loaders, the engine,
evaluation and benchmarks all resolve `"bf16"` the same way and reject a typo with the same
message.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from moe.errors import ConfigError

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
}
SHORT_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def resolve_dtype(name: Any, field: str = "dtype") -> Optional[torch.dtype]:
    """`None` and torch dtypes pass through; a name from `DTYPES` (any case) becomes its dtype;
    anything else is a ConfigError naming `field` and the allowed names."""
    if name is None or isinstance(name, torch.dtype):
        return name
    key = str(name).lower()
    if key not in DTYPES:
        raise ConfigError(f"{field}={name!r} is not one of {sorted(DTYPES)}")
    return DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    """The short name of a floating dtype (`fp32`, `bf16`, `fp16`), else str(dtype)."""
    return SHORT_NAMES.get(dtype, str(dtype).replace("torch.", ""))
