"""The figures of the expert analysis, drawn from the sections of results.json (eval/analysis/summary.py).

Every heatmap names its axes (expert, domain, MoE layer), labels its ticks with expert and layer
indices, and has a colour bar saying what the colour measures and where the uniform (or
independent) value lies; curves and bars have legends. Each function writes one PNG and returns
its path.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from eval.figures import pyplot, save_figure

DPI = 100


def _array(rows) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)


def _grid(plt, n: int, cell_w: float, cell_h: float, max_cols: int = 4):
    cols = min(n, max_cols)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cell_w * cols + 1.2, cell_h * rows + 0.9), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _heatmap(ax, data: np.ndarray, xlabel: str, ylabel: str, yticklabels: Sequence[str], norm, cmap,
             title: str, fmt: str = "{:.2f}"):
    """One labelled heatmap (NaN cells grey); cell values written in when the grid is small."""
    import matplotlib  # lazy, as above
    cm = matplotlib.colormaps[cmap].with_extremes(bad="#d0d0d0")
    im = ax.imshow(np.ma.masked_invalid(data), aspect="auto", norm=norm, cmap=cm, interpolation="nearest")
    rows, cols = data.shape
    ax.set_xticks(range(cols), [str(e) for e in range(cols)], fontsize=7 if cols <= 32 else 5)
    ax.set_yticks(range(rows), list(yticklabels), fontsize=8)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    if rows * cols <= 160:
        for (r, c), v in np.ndenumerate(data):
            if v == v:
                dark = abs(float(norm(v)) - 0.5) > 0.3
                ax.text(c, r, fmt.format(v), ha="center", va="center", fontsize=6,
                        color="white" if dark else "black")
    return im


def _finish(plt, fig, path: Path, suptitle: str) -> Path:
    fig.suptitle(suptitle, fontsize=10)
    return save_figure(fig, path, dpi=DPI, tight=False)  # the grids are laid out "constrained"


def _centred(vmin: float, centre: float, vmax: float):
    from matplotlib.colors import TwoSlopeNorm  # lazy, as above
    return TwoSlopeNorm(vmin=min(vmin, centre - 1e-6), vcenter=centre, vmax=max(vmax, centre + 1e-6))


def domain_heatmaps(section: dict, path: Path, title: str = "domain specialisation") -> Path:
    """Per MoE layer: domains x experts, the fraction of the domain's tokens routed to the
    expert; white = the uniform k/E, red above, blue below."""
    plt = pyplot()
    layers = section["layers"]
    data = [_array(L["fractions"]) for L in layers]
    E, D = data[0].shape[1], data[0].shape[0]
    fig, axes = _grid(plt, len(layers), max(3.0, 0.32 * E + 1.2), 0.35 * D + 1.3)
    norm = _centred(0.0, section["uniform"], max(float(np.nanmax(d)) for d in data))
    for ax, L, d in zip(axes, layers, data):
        im = _heatmap(ax, d, "expert", "domain", section["domains"], norm, "RdBu_r", f"MoE layer {L['layer']}")
    fig.colorbar(im, ax=axes, shrink=0.9,
                 label=f"fraction of the domain's tokens\n(uniform k/E = {section['uniform']:.3g})")
    return _finish(plt, fig, path, f"{title}: where each domain's tokens go")


def specialization_heatmap(section: dict, path: Path) -> Path:
    """MoE layers x experts: each expert's specialisation score, cells labelled with its domain."""
    plt = pyplot()
    from matplotlib.colors import Normalize  # lazy, as above
    layers = section["layers"]
    scores = _array([L["specialization"] for L in layers])
    E = scores.shape[1]
    fig, ax = plt.subplots(figsize=(max(4.5, 0.5 * E + 2.5), 0.5 * len(layers) + 1.6), layout="constrained")
    norm = Normalize(vmin=section["chance_specialization"], vmax=1.0)
    im = _heatmap(ax, scores, "expert", "MoE layer", [str(L["layer"]) for L in layers], norm, "viridis",
                  "cell: the expert's largest domain share, and that domain")
    if scores.size <= 160:
        for t in list(ax.texts):
            t.remove()
        for (r, c), v in np.ndenumerate(scores):
            if v == v:
                ax.text(c, r, f"{v:.2f}\n{layers[r]['top_domain'][c]}", ha="center", va="center", fontsize=5.5,
                        color="white" if v < (1 + norm.vmin) / 2 else "black")
    fig.colorbar(im, ax=ax, label=f"specialisation\n(1/D = {norm.vmin:.2f}: none; 1: one domain)")
    return _finish(plt, fig, path, "domain specialisation score per expert")


def vocabulary_heatmap(section: dict, path: Path) -> Path:
    """MoE layers x experts: the fraction of the expert's inputs explained by its top-N token ids."""
    plt = pyplot()
    from matplotlib.colors import Normalize  # lazy, as above
    layers = section["layers"]
    data = _array([[ex["top_n_fraction"] for ex in L["experts"]] for L in layers])
    fig, ax = plt.subplots(figsize=(max(4.5, 0.4 * data.shape[1] + 2.5), 0.45 * len(layers) + 1.6),
                           layout="constrained")
    im = _heatmap(ax, data, "expert", "MoE layer", [str(L["layer"]) for L in layers], Normalize(0.0, 1.0),
                  "magma", f"share of its inputs that are one of its {section['top_n']} most frequent token ids")
    fig.colorbar(im, ax=ax, label=f"fraction explained by top-{section['top_n']} ids")
    return _finish(plt, fig, path, "vocabulary specialisation")


def coactivation_heatmaps(section: dict, path: Path) -> Path:
    """Per MoE layer: experts x experts, lift P(i, j) / (P(i) P(j)); white = independent (1)."""
    plt = pyplot()
    layers = section["layers"]
    data = [_array(L["lift"]) for L in layers]
    E = data[0].shape[0]
    fig, axes = _grid(plt, len(layers), max(3.0, 0.3 * E + 1.2), max(2.8, 0.3 * E + 1.0))
    vmax = max(float(np.nanmax(d)) if np.isfinite(d).any() else 1.0 for d in data)
    norm = _centred(0.0, 1.0, vmax)
    for ax, L, d in zip(axes, layers, data):
        im = _heatmap(ax, d, "expert j", "expert i", [str(e) for e in range(E)], norm, "PuOr_r",
                      f"MoE layer {L['layer']}", fmt="{:.1f}")
    fig.colorbar(im, ax=axes, shrink=0.9, label="lift P(i,j) / (P(i) P(j))\n(1 = independent)")
    return _finish(plt, fig, path, "expert co-activation (uniform random top-k: lift "
                                   f"{section['uniform_lift']:.2f})")


def saturation_curves(section: dict, path: Path) -> Path:
    """Per MoE layer: the top-k overlap of each checkpoint's routing with the reference's, over steps."""
    plt = pyplot()
    points = section["checkpoints"]
    steps = [p["step"] for p in points]
    fig, ax = plt.subplots(figsize=(6.0, 3.6), layout="constrained")
    for li, layer in enumerate(section["layers"]):
        ax.plot(steps, [p["overlap"][li] for p in points], marker="o", ms=3, label=f"MoE layer {layer}")
    ax.plot(steps, [p["mean_overlap"] for p in points], color="black", ls="--", lw=1.5, label="mean")
    ax.set_xlabel("training step of the checkpoint")
    ax.set_ylabel(f"top-k overlap with step {section['reference_step']}")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _finish(plt, fig, path, f"router saturation ({section['probe_tokens']} probe tokens)")


def agreement_bars(section: dict, path: Path) -> Path:
    """Per MoE layer: top-k overlap and exact expert-set agreement of the two models."""
    plt = pyplot()
    layers = section["layers"]
    x = np.arange(len(layers))
    fig, ax = plt.subplots(figsize=(max(4.5, 0.7 * len(layers) + 2), 3.4), layout="constrained")
    ax.bar(x - 0.2, [L["overlap"] or 0 for L in layers], 0.4, label="top-k overlap")
    ax.bar(x + 0.2, [L["exact"] or 0 for L in layers], 0.4, label="same expert set")
    ax.set_xticks(x, [str(L["layer"]) for L in layers])
    ax.set_xlabel("MoE layer")
    ax.set_ylabel("fraction of probe tokens")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    o = section["other"]
    return _finish(plt, fig, path, f"routing agreement with {Path(o['path']).name} (top-{o['top_k']}, {o['dtype']})")


def generation_heatmaps(real: dict, generation: dict, path: Path) -> Path:
    """Per MoE layer, side by side: domains x experts fractions on real text (teacher-forced)
    and in the engine while it generates from prompts of that text."""
    plt = pyplot()
    layers = generation["layers"]
    pairs = [(_array(R["fractions"]), _array(G["engine_fractions"])) for R, G in zip(real["layers"], layers)]
    E, D = pairs[0][0].shape[1], pairs[0][0].shape[0]
    fig, axes = plt.subplots(len(layers), 2, figsize=(2 * max(3.8, 0.32 * E + 1.4) + 1.2,
                                                      len(layers) * (0.35 * D + 1.3) + 0.9), squeeze=False,
                             layout="constrained")
    norm = _centred(0.0, real["uniform"], max(float(np.nanmax(a)) for p in pairs for a in p))
    for row, (L, (r, g)) in enumerate(zip(layers, pairs)):
        tv = max(L["tv_engine_vs_teacher_forced"].values())
        _heatmap(axes[row][0], r, "expert", "domain", real["domains"], norm, "RdBu_r",
                 f"MoE layer {L['layer']}\nreal text (teacher-forced forward)")
        im = _heatmap(axes[row][1], g, "expert", "domain", real["domains"], norm, "RdBu_r",
                      f"MoE layer {L['layer']}\nengine while generating (TV vs forward {tv:.3f})")
        axes[row][1].set_ylabel("")
    fig.colorbar(im, ax=list(axes.flat), shrink=0.9,
                 label=f"fraction of the domain's tokens\n(uniform k/E = {real['uniform']:.3g})")
    return _finish(plt, fig, path, "expert usage: training-time forward vs the engine while it generates")


def plot_all(results: dict, run_dir: Path) -> dict[str, str]:
    """Every figure the sections of `results` allow: {name: path}."""
    out: dict[str, Optional[Path]] = {
        "domain_specialization": domain_heatmaps(results["domain_specialization"],
                                                 run_dir / "domain_specialization.png"),
        "specialization_scores": specialization_heatmap(results["domain_specialization"],
                                                        run_dir / "specialization_scores.png"),
        "vocabulary": vocabulary_heatmap(results["vocabulary"], run_dir / "vocabulary.png"),
    }
    if "skipped" not in results["coactivation"]:
        out["coactivation"] = coactivation_heatmaps(results["coactivation"], run_dir / "coactivation.png")
    if results.get("saturation") and "skipped" not in results["saturation"]:
        out["router_saturation"] = saturation_curves(results["saturation"], run_dir / "router_saturation.png")
    if results.get("agreement"):
        out["routing_agreement"] = agreement_bars(results["agreement"], run_dir / "routing_agreement.png")
    if results.get("generation") and "skipped" not in results["generation"]:
        out["generation"] = generation_heatmaps(results["domain_specialization"], results["generation"],
                                                run_dir / "generation.png")
    return {k: str(v) for k, v in out.items()}
