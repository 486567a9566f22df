"""Plain-text reports shared by the evaluations and the benchmarks: one Markdown table writer.

Imports nothing from `moe`; callers format their own cells (strings pass through unchanged).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence


def cell(value: Any, float_fmt: str = "{:.4f}") -> str:
    """A table cell: `-` for None, floats with `float_fmt`, anything else as `str`."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return float_fmt.format(value)
    return str(value)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], align: Optional[Sequence[str]] = None,
                   float_fmt: str = "{:.4f}") -> str:
    """A GitHub-flavoured Markdown table. `align` holds one of "l" / "r" per column (default: left)."""
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    align = list(align) if align is not None else ["l"] * len(columns)
    if len(align) != len(columns):
        raise ValueError(f"align has {len(align)} entries for {len(columns)} columns")
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(marks[a] for a in align) + "|"]
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"a row has {len(row)} cells for {len(columns)} columns: {row!r}")
        lines.append("| " + " | ".join(cell(v, float_fmt) for v in row) + " |")
    return "\n".join(lines)
