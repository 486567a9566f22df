"""awq: int4's storage; the weights were scaled by AWQ's activation-aware search first, on
calibration text (`moe/quant/awq.py`, `moe/quant/calibration.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from moe.quant.schemes.base import QUANT_SCHEMES, positive_int
from moe.quant.schemes.int4 import Int4, check_group_size


@QUANT_SCHEMES.register("awq")
class AWQ(Int4):
    """int4 storage; `moe.quant.awq` scales the weights (and folds the inverse into the layer
    before) from calibration activations first."""

    name = "awq"
    searches_scales = True

    @dataclass
    class Config:
        group_size: int = 128  # inputs per scale and zero point
        calib_path: Optional[str] = None  # a calibration text file (required; not the evaluation text)
        calib_tokens: int = 4096  # calibration tokens
        n_grid: int = 20  # points of the alpha grid

        def __post_init__(self):
            check_group_size(self.group_size)
            positive_int("calib_tokens", self.calib_tokens)
            positive_int("n_grid", self.n_grid)
