"""The Markdown report (eval/analysis/report.py): every section, its figure, its table; skipped
sections say why; tokens are escaped for table cells."""

from __future__ import annotations

from eval.analysis.report import token_text, write_report


def test_report_has_every_section_figure_and_table(results, tmp_path):
    # The report links the figures by file name (tests/eval/analysis/test_plots.py draws them).
    names = ["domain_specialization", "specialization_scores", "vocabulary", "coactivation", "router_saturation",
             "routing_agreement", "generation"]
    results["plots"] = {name: str(tmp_path / f"{name}.png") for name in names}
    text = write_report(results, tmp_path / "report.md").read_text()
    for heading in ("## Domains", "## 1. Domain specialisation", "## 2. Vocabulary specialisation", "## 3. Co-activation",
                    "## 4. Router saturation over training", "## 5. Routing agreement between two models",
                    "## 6. Expert usage under generation"):
        assert heading in text
    for name in results["plots"]:
        assert f"![{name}]({name}.png)" in text
    # Layer 1: experts 2 and 3 see code only (score 1), experts 0 and 1 code at a third of their rate (3/7).
    assert "| 1 | 0.714 | 3 | code | 1.000 |" in text
    assert "2+3: lift 3.00, P(j\\|i) 1.00" in text  # a pipe inside a cell is escaped
    assert "| 2 | 0.500 | 0.250 | 0.375 |" in text  # the saturation table row of step 2
    assert "(top-k 1, bf16)" in text and "&lt;0&gt; (1.00)" in text


def test_skipped_sections_say_why(results, tmp_path):
    results.update(coactivation={"skipped": "top-k = 1: each token has one expert"},
                   saturation={"skipped": "the run keeps 1 checkpoint"}, agreement=None,
                   generation={"skipped": "eval.generate=false"}, plots={})
    text = write_report(results, tmp_path / "report.md").read_text()
    assert "Skipped: top-k = 1: each token has one expert." in text and "Skipped: the run keeps 1 checkpoint." in text
    assert "Skipped: eval.generate=false." in text and "## 5." not in text and "![" not in text


def test_token_text_escapes():
    assert token_text("a|<b>\n") == "a\\|&lt;b&gt;\\n"
    assert token_text(" the") == " the"
