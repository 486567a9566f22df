"""What every evaluation figure shares: matplotlib without a display, imported only when a figure
is drawn (it is heavy, and the task modules are imported with the task registry), and one way to
write a figure to a PNG and free it."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib  # lazy: heavy, and only the figures need it
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: Path, dpi: int = 90, tight: bool = True) -> Path:
    """Write `fig` to `path` (PNG), close it (pyplot keeps every open figure alive), return `path`."""
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
