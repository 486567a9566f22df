"""A test's measured values, written for a docs/results/ record when asked (issue 29 item 7).

A test that quotes a measured figure in the docs (e.g. the AWQ-vs-RTN MSEs) calls
`record_measurement(name, values)` beside its assertions. Without `MOE_LAB_RECORD_DIR` in the
environment it does nothing (the suite writes no files); with it, it writes
`$MOE_LAB_RECORD_DIR/<name>.json`: the values, the torch version, thread count and load average.
It never overwrites: an existing file is an error, so repeats go to fresh folders.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Optional

import torch

ENV = "MOE_LAB_RECORD_DIR"


def record_measurement(name: str, values: dict) -> Optional[Path]:
    """Write `values` (JSON-able) to `$MOE_LAB_RECORD_DIR/<name>.json`; None when the variable is unset."""
    folder = os.environ.get(ENV)
    if not folder:
        return None
    path = Path(folder) / f"{name}.json"
    if path.exists():
        raise FileExistsError(f"{ENV}: {path} exists; record each repeat into a new folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"name": name, "values": values, "torch": torch.__version__, "python": platform.python_version(),
              "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "load_after": os.getloadavg()}
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return path
