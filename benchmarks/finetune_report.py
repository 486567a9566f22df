"""The upcycle part's records of benchmarks/finetune_runs.py: merging per-seed records, the plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence


def read_upcycle_records(files: Sequence[Path]) -> list[dict]:
    """Upcycle records that can be merged: the same settings, no seed twice (else a ValueError)."""
    runs = [json.loads(Path(f).read_text()) for f in files]
    settings = {(r["model"], r["dense_steps"], r["steps"]) for r in runs}
    if len(settings) != 1:
        raise ValueError(f"merge-upcycle: the files differ in (model, dense_steps, steps): {sorted(settings)}")
    seeds = [seed["seed"] for r in runs for seed in r["per_seed"]]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"merge-upcycle: a seed is in more than one file: {seeds}")
    return runs


def plot_upcycle(per_seed: Sequence[dict], dense_steps: int, path: Path) -> None:
    """Left: validation loss against the tokens trained after upcycling; right: against all tokens
    (the upcycled and continued-dense curves shifted by the dense pretraining's tokens)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    style = {"upcycled": "tab:red", "scratch": "tab:blue", "scratch_total": "tab:cyan", "dense": "tab:gray",
             "dense_continued": "tab:green"}
    label = {"upcycled": "upcycled MoE (8 experts, top-2)", "scratch": "same MoE from scratch",
             "scratch_total": "same MoE from scratch, longer schedule", "dense": "dense pretraining",
             "dense_continued": "dense, trained on"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, seed in enumerate(per_seed):
        curves = seed["curves"]
        pre = curves["dense"][-1]["tokens"] if curves["dense"] else 0
        for name in ("upcycled", "scratch", "dense_continued"):
            xs = [p["tokens"] for p in curves[name]]
            ys = [p["val_loss"] for p in curves[name]]
            axes[0].plot(xs, ys, color=style[name], ls="-" if i == 0 else "--",
                         label=f"{label[name]}, seed {seed['seed']}")
        for name in ("dense", "upcycled", "scratch_total", "dense_continued"):
            shift = pre if name in ("upcycled", "dense_continued") else 0
            xs = [p["tokens"] + shift for p in curves[name]]
            ys = [p["val_loss"] for p in curves[name]]
            axes[1].plot(xs, ys, color=style[name], ls="-" if i == 0 else "--",
                         label=f"{label[name]}, seed {seed['seed']}")
    axes[0].set_title("same tokens after upcycling")
    axes[1].set_title(f"all tokens, including the dense model's {dense_steps} steps")
    for ax in axes:
        ax.set_xlabel("training tokens")
        ax.set_ylabel("validation loss (nats/token)")
        ax.set_ylim(top=min(8.5, ax.get_ylim()[1]))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
