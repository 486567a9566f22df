"""Calibration tokens for AWQ (`quant.calib_path`, `quant.calib_tokens`).

The text should resemble what the model will see, and must not be the evaluation text (AWQ
would then be tuned on the test set): `python -m eval task=quant_sweep` refuses a calibration
file that is its perplexity file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch

from moe.errors import ConfigError


def calibration_ids(tokenizer, path: Optional[str], n_tokens: int, seq_len: int) -> torch.Tensor:
    """The first `n_tokens` tokens of the text file `path`, as rows of `seq_len` -> [B, seq_len]
    (a partial last row is dropped)."""
    if path is None:
        raise ConfigError("quantization=awq needs calibration text: set quant.calib_path to a text file")
    p = Path(os.path.expanduser(str(path)))
    if not p.is_file():
        raise ConfigError(f"quant.calib_path={str(path)!r} is not a file")
    if tokenizer is None:
        raise ConfigError("quantization=awq needs the checkpoint's tokenizer to encode quant.calib_path")
    ids: list[int] = []
    with p.open(encoding="utf-8", errors="replace") as f:
        while len(ids) < n_tokens:
            chunk = f.read(1 << 16)
            if not chunk:
                break
            ids.extend(tokenizer.encode(chunk))
    ids = ids[:n_tokens]
    seq_len = max(1, min(seq_len, len(ids)))
    n_rows = len(ids) // seq_len
    if n_rows == 0:
        raise ConfigError(f"quant.calib_path={str(path)!r} holds no text")
    return torch.tensor(ids[:n_rows * seq_len], dtype=torch.long).view(n_rows, seq_len)
