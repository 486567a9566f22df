"""The figures (eval/analysis/plots.py) are real PNGs of a readable size, one per section, and
large expert counts still draw."""

from __future__ import annotations

import torch
from PIL import Image

from eval.analysis import plots, summary
from tests.eval.analysis.conftest import make_record


def open_png(path) -> tuple[int, int]:
    with Image.open(path) as im:
        assert im.format == "PNG"
        return im.size


def test_every_section_has_its_figure(results, tmp_path):
    paths = plots.plot_all(results, tmp_path)
    assert set(paths) == {"domain_specialization", "specialization_scores", "vocabulary", "coactivation",
                          "router_saturation", "routing_agreement", "generation"}
    for name, path in paths.items():
        assert path == str(tmp_path / f"{name}.png")
        w, h = open_png(path)
        assert w >= 400 and h >= 250, (name, w, h)


def test_skipped_sections_draw_nothing(results, tmp_path):
    results.update(coactivation={"skipped": "top-k = 1"}, saturation={"skipped": "one checkpoint"}, agreement=None,
                   generation={"skipped": "eval.generate=false"})
    assert set(plots.plot_all(results, tmp_path)) == {"domain_specialization", "specialization_scores", "vocabulary"}


def test_many_experts_still_draw(tmp_path):
    # 32 experts: 1,024 cells per layer, drawn without cell values, in a wider figure.
    g = torch.Generator().manual_seed(0)
    rows = [torch.rand(300, 32, generator=g).argsort(1)[:, :4].tolist() for _ in range(2)]
    record = make_record(rows, (torch.arange(300) % 3).tolist(), torch.randint(0, 50, (300,)).tolist(), n_experts=32)
    w, h = open_png(plots.coactivation_heatmaps(summary.coactivation_section(record), tmp_path / "c.png"))
    assert w >= 800 and h >= 300
