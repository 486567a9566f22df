"""What a Hugging Face model directory looks like, without importing transformers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

PROVENANCE_FILE = "moe_lab.json"  # written by `python -m moe.hf export`: source checkpoint, step, our config


def is_hf_dir(path: Any) -> bool:
    """True for a directory holding an HF `config.json` (one with a `model_type`).

    A moe-lab run directory also has a `config.json` (our resolved config), but without
    `model_type`, so the two are never confused.
    """
    p = Path(os.path.expanduser(str(path)))
    cfg = p / "config.json"
    if not (p.is_dir() and cfg.is_file()):
        return False
    try:
        return "model_type" in json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False
