"""The README and docs/ name only things that exist, and every recorded figure has its record.

Fast, no network: it reads README.md and docs/**/*.md as text.

What counts, precisely:
- **Links**: every Markdown link `[text](target)` whose target has no URL scheme (`https:`,
  `mailto:`, ...) and is not a bare `#anchor`. The target, without its `#anchor`, is resolved
  against the folder of the document that holds it and must be an existing file or folder.
- **Paths in backticks**: an inline code span (`...` outside fenced code blocks) is a repository
  path when it is one token (no whitespace) whose first `/`-separated part is a top-level folder
  of the repository (`REPO_FOLDERS`) and that names a file (its last part has an extension:
  `moe/engine/engine.py`, `configs/router/topk.yaml`) or a folder (it ends with `/`: `tests/train/`).
  Metric keys such as `moe/train_eval_overlap` have neither, so they are not paths. A `:suffix` (a line number or a function name: `moe/train/loop.py:train`) is
  dropped first. Spans holding a placeholder (`<`, `>`, `{`, `}`, `$`, `...`) are templates, not
  paths, and are skipped; a span with a glob (`*`, `?`, `[`) must match at least one file. Paths
  outside the repository (`outputs/runs/x`, `../shared/data/...`) never start with a repository
  folder, so they are not checked.
- **Figures**: every image (`.png`, `.jpg`, `.svg`) under docs/results/ has, in its own folder, a
  raw data file (`.json` or `.jsonl`) and a record of how it was made (`README.md`, `record.json`
  or `command.txt`), unless docs/results/MISSING.md names it (figures whose raw data was never
  committed, listed so they are re-run; each name there must be an existing figure).
- **README length**: at most 200 lines.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200
# The top-level folders whose names, at the start of a backticked span, make it a repository path.
REPO_FOLDERS = ("moe", "eval", "kernels", "benchmarks", "tests", "configs", "docs", "hydra_plugins", ".ci")
FIGURE_SUFFIXES = {".png", ".jpg", ".jpeg", ".svg"}
DATA_SUFFIXES = {".json", ".jsonl"}
RECORD_NAMES = {"README.md", "record.json", "command.txt"}
MISSING = REPO / "docs" / "results" / "MISSING.md"

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
FENCE = re.compile(r"^\s*(```|~~~)")
PLACEHOLDER = re.compile(r"[<>{}$]|\.\.\.")


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    out, in_fence = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            out.append((n, line))
    return out


def relative_links(path: Path) -> list[tuple[int, str]]:
    links = []
    for n, line in prose_lines(path):
        for m in LINK.finditer(line):
            target = m.group(1) or m.group(2)
            if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            links.append((n, target))
    return links


def backticked_repo_paths(path: Path) -> list[tuple[int, str]]:
    paths = []
    for n, line in prose_lines(path):
        for m in INLINE_CODE.finditer(line):
            span = m.group(1).strip()
            if not span or any(c.isspace() for c in span) or PLACEHOLDER.search(span):
                continue
            span = span.split(":", 1)[0]
            last = span.rstrip("/").rsplit("/", 1)[-1]
            if span.split("/", 1)[0] in REPO_FOLDERS and "/" in span and ("." in last or span.endswith("/")):
                paths.append((n, span))
    return paths


def test_every_relative_link_resolves():
    broken = [f"{p.relative_to(REPO)}:{n}: {t}" for p in doc_files() for n, t in relative_links(p)
              if not (p.parent / t.split("#", 1)[0]).exists()]
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_every_backticked_repository_path_exists():
    def exists(span: str) -> bool:
        if any(c in span for c in "*?["):
            return bool(glob.glob(str(REPO / span)))
        return (REPO / span).exists()

    missing = [f"{p.relative_to(REPO)}:{n}: {s}" for p in doc_files() for n, s in backticked_repo_paths(p)
               if not exists(s)]
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def exempt_figures() -> set[Path]:
    """The figures docs/results/MISSING.md lists as lacking raw data (backticked docs/results/ paths)."""
    if not MISSING.is_file():
        return set()
    return {REPO / s for _, s in backticked_repo_paths(MISSING) if Path(s).suffix.lower() in FIGURE_SUFFIXES}


def test_every_figure_in_results_has_its_record_beside_it():
    exempt = exempt_figures()
    assert all(f.is_file() for f in exempt), "MISSING.md names figures that do not exist"
    lacking = []
    for fig in sorted((REPO / "docs" / "results").rglob("*")):
        if fig.suffix.lower() not in FIGURE_SUFFIXES or fig in exempt:
            continue
        beside = list(fig.parent.iterdir())
        has_data = any(f.suffix in DATA_SUFFIXES and f.name != "record.json" for f in beside)
        has_record = any(f.name in RECORD_NAMES for f in beside)
        if not (has_data and has_record):
            lacking.append(str(fig.relative_to(REPO)))
    assert not lacking, "figures without raw data + a record beside them (or a MISSING.md entry):\n" + "\n".join(lacking)


def test_readme_stays_short():
    n = len((REPO / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; the limit is {README_MAX_LINES}: move detail into docs/"


@pytest.mark.parametrize("text, expected", [
    ("see `moe/engine/engine.py` and `moe/train/loop.py:train`", ["moe/engine/engine.py", "moe/train/loop.py"]),
    ("`moe/train_eval_overlap` `tests/train/`", ["tests/train/"]),
    ("`outputs/runs/x`, `../shared/data/x.txt`, `moe/routers/<name>.py`, `tests/...`, `python -m moe.serve`", []),
    ("```\n`moe/not_checked_in_a_fence.py`\n```\n`configs/router/*.yaml`", ["configs/router/*.yaml"]),
])
def test_the_path_rule_takes_repository_paths_only(tmp_path, text, expected):
    doc = tmp_path / "d.md"
    doc.write_text(text, encoding="utf-8")
    assert [s for _, s in backticked_repo_paths(doc)] == expected


def test_the_link_rule_skips_urls_and_anchors(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("[a](https://x.org/a.md) [b](#top) [c](guides/c.md#part) ![d](fig.png)", encoding="utf-8")
    assert [t for _, t in relative_links(doc)] == ["guides/c.md#part", "fig.png"]
