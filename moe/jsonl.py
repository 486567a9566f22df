"""JSON lines that survive crashes and strict readers: the format of `metrics.jsonl` and `summary.json`.

* Non-finite floats (a diverged loss) are not valid JSON: `dumps_record` writes them as `null`
  and lists them under `"nonfinite": {"train/loss": "nan"}`, so strict readers (jq, JavaScript,
  `json.loads(..., parse_constant=...)` refusing NaN) read every line and nothing is lost.
* A crash in the middle of a write leaves a torn last line: `read_records` drops it with a
  warning instead of failing; a damaged line anywhere else is an error naming the file and line.

The standard `json` module does the encoding; only the non-finite handling is ours (there is
no library option that maps NaN to null and keeps a record of it).
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Optional

from moe.errors import UserError

log = logging.getLogger("moe")

NONFINITE_KEY = "nonfinite"


def flatten(d: dict, prefix: str = "") -> dict:
    """A nested dict (a config as JSON) as one level of dotted keys: {"a": {"b": 1}} -> {"a.b": 1}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def nonfinite_name(v: float) -> str:
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def split_nonfinite(record: dict) -> tuple[dict, dict[str, str]]:
    """(record with every non-finite float replaced by None, {key: 'nan' | 'inf' | '-inf'})."""
    bad = {k: nonfinite_name(v) for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)}
    if not bad:
        return record, {}
    return {k: (None if k in bad else v) for k, v in record.items()}, bad


def dumps_record(record: dict) -> str:
    """One strict-JSON line (no newline): non-finite floats become null, listed under "nonfinite"."""
    clean, bad = split_nonfinite(record)
    if bad:
        clean = {**clean, NONFINITE_KEY: {**clean.get(NONFINITE_KEY, {}), **bad}}
    return json.dumps(clean, allow_nan=False)


def read_records(path: Path, max_step: Optional[int] = None) -> list[dict]:
    """The records of a JSONL file (those with step <= `max_step` when given). A torn last line
    (a crash mid-write) is dropped with a warning; a bad line before it raises UserError."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            if i == len(lines) - 1:
                log.warning("%s: dropping the torn last line %d (a crash in the middle of a write): %r",
                            path, i + 1, line[:80])
                continue
            raise UserError(f"{path}: line {i + 1} is not valid JSON ({line[:80]!r}); fix or remove it") from None
        if max_step is None or rec.get("step", 0) <= max_step:
            records.append(rec)
    return records


def write_records(path: Path, records: list[dict]) -> None:
    """Replace `path` with `records` atomically (temp file, fsync, rename)."""
    write_text_atomic(path, "".join(dumps_record(r) + "\n" for r in records))


def write_json(path: Path, obj: Any) -> None:
    """A JSON document (e.g. summary.json), strict and atomic; non-finite top-level floats as in
    `dumps_record`."""
    if isinstance(obj, dict):
        clean, bad = split_nonfinite(obj)
        obj = {**clean, NONFINITE_KEY: bad} if bad else clean
    write_text_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
