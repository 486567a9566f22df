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
- **Measured figures** (see `unrecorded_figures`): a number with a unit of time (`ms`, `s`, `min`,
  ...), throughput (`tok/s`, `tokens/s`, ...), memory (`MiB`, `GiB`, `GB`, ...), a speed-up
  written `1.22x` / `2×` (no space and no number after it: `8x7B`, `256 x 1024`, `2 × 2` are shapes,
  not ratios) or a percentage; the upper end of a range (`5-15 s`) counts, a number after a
  word and a hyphen (`top-2`) does not.
  Not a measurement (the heuristic): numbers inside code spans or fenced blocks (commands,
  config values; an indented code block counts as fenced), and bounds: a number right after
  `<`, `>`, `≤`, `≥`, `<=`, `>=` or one of `at most`, `at least`, `up to`, `under`, `over`,
  `above`, `below`, `exceed(s)`, `than`, `within`, `every`, `after`, `last`, `timeout`, `limit`,
  `default`, `target`. A block (a paragraph, a list item or a table row) quoting one must be
  backed: a link in the block or in its section (heading to next heading) into a record folder
  (`docs/results/<name>/` holding raw `.json`/`.jsonl` and a `README.md`/`record.json`/
  `command.txt`); or the doc is itself in a record folder; or docs/results/MISSING.md links the
  section (`doc.md#anchor`; a whole doc only for docs under docs/results/); or an HTML comment
  `<!-- not-a-measurement: why -->` inside the block or on the line before it (then it covers
  the paragraph or table that follows) says it is arithmetic, a config value or a hardware spec.
- **Held figures** (see `unheld_figures`): a backed block must also quote what its records say.
  For each block whose measured figures are backed by links into record folders (its own links,
  or else, when it has none, those of its section: the links `unrecorded_figures` accepts), the
  number of each measured figure must occur in the text those links point at: for each link, the
  linked folder (or the linked file's folder) with every `.md`, `.txt`, `.json`, `.jsonl` and
  `.csv` file in it and in its sub-folders, recursively, except a sub-folder with a README.md of
  its own (a record of its own, as the runs under docs/results/generate/: it counts only where a
  link points into it). So a link to `generate/quiet_1205b/README.md` holds that run's files, a
  link to `generate/README.md` the summary's, not every run's. The number is the figure's
  digits (`1,234.5` of `1,234.5 tok/s`, `1.30` of `1.30x`); it occurs when the record holds it
  as written or without its thousands separators, not preceded by a digit or `.` (a `,` may
  precede it: CSV rows, compact JSON lists), and followed, for a decimal, by any further digits
  (`1.30` is held by `1.30` and `1.3017`, not by `1.3` or `11.30`), for an integer, by an
  optional `.digits` and then no digit (`104` is held by `104`, `104.0` and `104.7`, not by
  `1040` or `2104`; `12,345` by `12,345` and `12345.6`); a decimal whose decimals are all zeros
  is held by its integer too (`100.0` by `100`). So the doc may truncate a record's
  number, never round it up or change it; a number the record holds only in another form (bytes
  for GiB, seconds for minutes, a ratio of two raw values) needs one line in the record's README
  deriving it from the raw values. Exempt: blocks marked `<!-- not-a-measurement: why -->` (and
  indented code), docs inside a record folder (they are records), blocks whose section links no
  record (those are `unrecorded_figures`' business: MISSING.md). It is a necessary check, not a
  proof: a small integer (`5%`) is easily held by chance.
- **README length**: at most 200 lines.
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200
# The top-level folders whose names, at the start of a backticked span, make it a repository path.
REPO_FOLDERS = ("moe", "eval", "kernels", "benchmarks", "tests", "configs", "docs", "hydra_plugins", ".ci")
RESULTS = REPO / "docs" / "results"
FIGURE_SUFFIXES = {".png", ".jpg", ".jpeg", ".svg"}
DATA_SUFFIXES = {".json", ".jsonl"}
RECORD_NAMES = {"README.md", "record.json", "command.txt"}
HELD_SUFFIXES = {".md", ".txt", ".json", ".jsonl", ".csv"}  # the files whose text a record "holds"
MISSING = REPO / "docs" / "results" / "MISSING.md"

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
FENCE = re.compile(r"^\s*(```|~~~)")
PLACEHOLDER = re.compile(r"[<>{}$]|\.\.\.")
MEASURED = re.compile(
    r"(?<![\w./])(?<![A-Za-z_]-)\d[\d,]*(?:\.\d+)?(?:"
    r"\s?(?:ms|µs|us|ns|s|sec|seconds?|min|minutes?|hours?|h|GiB|MiB|KiB|TiB|GB|MB|KB|TB"
    r"|tok/s|tokens/s|it/s|steps/s|req/s|requests/s|samples/s)(?![\w/])"
    r"|[x×](?![\w])(?!\s?\d)|\s?%)")
BOUND = re.compile(r"(?:[<>≤≥]=?|\b(?:at most|at least|up to|under|over|above|below|exceeds?|than|within|every|after|last|timeout|limit|default|target))"
                   r"\s*[~≈]?\s*$", re.IGNORECASE)
NOT_A_MEASUREMENT = re.compile(r"<!--\s*not-a-measurement:\s*\S.*?-->")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")


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


def measured_figures(line: str) -> list[str]:
    """The measured figures of one line of prose (code spans and link targets removed; bounds skipped)."""
    text = re.sub(r"\]\([^)]*\)", "]", INLINE_CODE.sub(" ", line))
    return [m.group(0) for m in MEASURED.finditer(text) if not BOUND.search(text[:m.start()])]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", re.sub(r"`|\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()).replace(" ", "-")


def blocks(path: Path) -> list[dict]:
    """The doc's paragraphs, list items and table rows: first line, lines, section anchor, exempt flag."""
    out, section, cur, marked = [], "", None, False
    for n, line in prose_lines(path):
        heading = HEADING.match(line)
        if heading or not line.strip():
            cur = None
            if heading:
                section, marked = slug(heading.group(2)), False
            elif out and out[-1]["lines"]:
                marked = False  # a marker on its own line covers the next paragraph or table only
            continue
        if NOT_A_MEASUREMENT.fullmatch(line.strip()):
            marked = True
            continue
        if cur is None and line.startswith("    ") and not LIST_ITEM.match(line):
            cur = {"line": n, "lines": [], "section": section, "exempt": True}  # an indented code block
            continue
        if cur is None or line.lstrip().startswith("|") or LIST_ITEM.match(line):
            cur = {"line": n, "lines": [], "section": section, "exempt": marked}
            out.append(cur)
        cur["lines"].append(line)
        cur["exempt"] = cur["exempt"] or bool(NOT_A_MEASUREMENT.search(line))
    return out


def record_root(target: Path) -> Path | None:
    """The docs/results/<name>/ folder `target` is in, if that folder holds raw data and a record of how it was made."""
    try:
        name = target.resolve().relative_to(RESULTS.resolve()).parts[0]
    except (ValueError, IndexError):
        return None
    folder = RESULTS / name
    files = [f for f in folder.rglob("*") if f.is_file()] if folder.is_dir() else []
    if (any(f.suffix in DATA_SUFFIXES and f.name != "record.json" for f in files)
            and any(f.name in RECORD_NAMES for f in files)):
        return folder
    return None


def record_folder(target: Path) -> bool:
    """Is `target` inside a docs/results/<name>/ folder holding raw data and a record of how it was made?"""
    return record_root(target) is not None


def missing_sections(missing: Path = MISSING) -> set[tuple[Path, str]]:
    """(doc, anchor) pairs MISSING.md links to; anchor "" (the whole doc) only for docs under docs/results/."""
    if not missing.is_file():
        return set()
    out = set()
    for _, target in relative_links(missing):
        doc, _, anchor = target.partition("#")
        path = (missing.parent / doc).resolve()
        if anchor or RESULTS.resolve() in path.parents:
            out.add((path, anchor))
    return out


def block_records(path: Path, block: dict) -> set[Path]:
    """The folders the block's own links point into, inside record folders: a linked folder, or a linked file's."""
    folders = set()
    for target in (m.group(1) or m.group(2) for line in block["lines"] for m in LINK.finditer(line)):
        linked = path.parent / target.split("#", 1)[0]
        if "://" not in target and record_root(linked) is not None:
            linked = linked.resolve()
            folders.add(linked if linked.is_dir() else linked.parent)
    return folders


def unrecorded_figures(path: Path, missing: Path = MISSING) -> list[str]:
    """'doc:line: figures' for each block quoting a measured figure with no record behind it."""
    if path.resolve() == missing.resolve() or record_folder(path):
        return []
    listed = missing_sections(missing)
    if (path.resolve(), "") in listed:
        return []
    doc_blocks = blocks(path)
    backed_sections = set()
    for b in doc_blocks:
        if block_records(path, b):
            b["exempt"] = True
            backed_sections.add(b["section"])
    found = []
    for b in doc_blocks:
        if b["exempt"] or b["section"] in backed_sections or (path.resolve(), b["section"]) in listed:
            continue
        figures = [f for line in b["lines"] for f in measured_figures(line)]
        if figures:
            found.append(f"{path}:{b['line']}: {', '.join(figures)}")
    return found


def record_text(folder: Path) -> str:
    """The text a linked folder holds: its HELD_SUFFIXES files and those of its sub-folders, recursively,
    except sub-folders with a README.md of their own (records of their own, held only where linked)."""
    parts = []
    for f in sorted(folder.iterdir()):
        if f.is_dir() and not (f / "README.md").is_file():
            parts.append(record_text(f))
        elif f.is_file() and f.suffix in HELD_SUFFIXES:
            parts.append(f.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


def held(figure: str, text: str) -> bool:
    """Does `text` hold the number of `figure` (the rule of the module docstring, "Held figures")?"""
    number = re.match(r"\d[\d,]*(?:\.\d+)?", figure).group(0)
    forms = "|".join(re.escape(f) for f in dict.fromkeys([number, number.replace(",", "")]))
    tail = r"\d*" if "." in number else r"(?:\.\d+)?(?!\d)"
    if re.search(rf"(?<![\d.])(?:{forms}){tail}", text):
        return True
    whole, _, decimals = number.partition(".")
    return bool(decimals) and not decimals.strip("0") and held(whole, text)  # 100.0 is held by 100


def unheld_figures(path: Path, missing: Path = MISSING, texts: dict[Path, str] | None = None) -> list[str]:
    """'doc:line: figures' for each block whose backing records do not hold some of its measured figures.

    `texts` caches each record folder's text across calls (one test run reads each folder once)."""
    if path.resolve() == missing.resolve() or record_folder(path):
        return []
    doc_blocks = blocks(path)
    own = [block_records(path, b) for b in doc_blocks]
    by_section: dict[str, set[Path]] = {}
    for b, folders in zip(doc_blocks, own):
        by_section.setdefault(b["section"], set()).update(folders)
    texts = {} if texts is None else texts
    found = []
    for b, folders in zip(doc_blocks, own):
        folders = folders or by_section[b["section"]]
        if b["exempt"] or not folders:
            continue
        for f in folders - texts.keys():
            texts[f] = record_text(f)
        text = "\n".join(texts[f] for f in sorted(folders))
        figures = [f for line in b["lines"] for f in measured_figures(line) if not held(f, text)]
        if figures:
            names = ", ".join(f.name for f in sorted(folders))
            found.append(f"{path}:{b['line']}: {', '.join(figures)} (not in {names})")
    return found


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


def test_every_measured_figure_has_a_record_or_a_missing_entry():
    lacking = [line for p in doc_files() for line in unrecorded_figures(p)]
    assert not lacking, ("measured figures with no docs/results/<name>/ record linked from their paragraph or "
                         "section and no docs/results/MISSING.md entry:\n" + "\n".join(lacking))


def test_every_section_missing_md_names_exists():
    anchors = {p.resolve(): {b["section"] for b in blocks(p)} | {""} for p in doc_files()}
    dangling = [f"{doc}#{a}" for doc, a in missing_sections() if a not in anchors.get(doc, {a})]
    assert not dangling, "MISSING.md links sections that do not exist:\n" + "\n".join(dangling)


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


@pytest.mark.parametrize("line, expected", [
    ("decodes at 218 tok/s, 1.23x the plain engine, in 14.7 s with 43.22 MiB (5% under)",
     ["218 tok/s", "1.23x", "14.7 s", "43.22 MiB", "5%"]),
    ("ranges count: 5-15 s a cell, 1.22–1.28x; a name does not: top-2 s", ["15 s", "1.28x"]),
    ("Mixtral-8x7B, a 256 x 1024 matrix, a 2 × 2 sweep, `--device-memory 141GB`, [x](a/3s.md)", []),
    ("at most 1.3x the weights, under 1 %, timeout 30 s, within 2x, < 0.5x, every 10 s", []),
])
def test_the_figure_rule_takes_measurements_only(line, expected):
    assert measured_figures(line) == expected


def write_doc(folder: Path, text: str) -> Path:
    doc = folder / "guide.md"
    doc.write_text(text, encoding="utf-8")
    return doc


def test_a_planted_unrecorded_figure_fails_and_each_way_of_backing_it_passes(tmp_path):
    missing = tmp_path / "MISSING.md"
    plain = "# Guide\n\n## Speed\n\nThe engine decodes 218 tok/s here.\n\n## Other\n\nNo figure.\n"
    doc = write_doc(tmp_path, plain)
    assert [line.split(":", 2)[1:] for line in unrecorded_figures(doc, missing)] == [["5", " 218 tok/s"]]

    record = Path(os.path.relpath(RESULTS / "engine_overhead" / "README.md", tmp_path))
    assert record_folder(tmp_path / record)
    write_doc(tmp_path, plain.replace("here.", f"here.\n\nRecord: [run]({record})."))
    assert unrecorded_figures(doc, missing) == []  # a record linked from the same section

    no_data = tmp_path / "results" / "only_prose"  # a results folder with a README and no raw data
    no_data.mkdir(parents=True)
    (no_data / "README.md").write_text("# A run\n\nIt was fast.\n", encoding="utf-8")
    write_doc(tmp_path, plain.replace("here.", "here ([run](results/only_prose/README.md))."))
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(globals(), "RESULTS", tmp_path / "results")
        assert len(unrecorded_figures(doc, missing)) == 1  # a results folder without raw data is no record
        (no_data / "run.json").write_text("{}", encoding="utf-8")
        assert unrecorded_figures(doc, missing) == []  # ... and with its raw data it is one

    write_doc(tmp_path, plain.replace("here.", "here. <!-- not-a-measurement: a config value -->"))
    assert unrecorded_figures(doc, missing) == []

    write_doc(tmp_path, plain)
    missing.write_text("| x | [g](guide.md#other) |\n", encoding="utf-8")
    assert len(unrecorded_figures(doc, missing)) == 1  # another section listed: still unbacked
    missing.write_text("| x | [g](guide.md) |\n", encoding="utf-8")
    assert len(unrecorded_figures(doc, missing)) == 1  # a whole guide cannot be listed, only a section
    missing.write_text("| x | [g](guide.md#speed) |\n", encoding="utf-8")
    assert unrecorded_figures(doc, missing) == []


def test_a_marker_line_covers_the_next_table_only(tmp_path):
    doc = write_doc(tmp_path, "<!-- not-a-measurement: arithmetic -->\n| a | 80 GB |\n| b | 141 GB |\n\n"
                              "| c | 3 GB |\n\n    python x.py --mem 4GB\n")
    assert [line.rsplit(": ", 1)[1] for line in unrecorded_figures(doc, tmp_path / "MISSING.md")] == ["3 GB"]


def test_every_measured_figure_is_held_by_its_record():
    texts: dict[Path, str] = {}
    unheld = [line for p in doc_files() for line in unheld_figures(p, texts=texts)]
    assert not unheld, ("measured figures whose number is in none of the record folders their block (or else its "
                        "section) links; correct the doc to the record, add the derivation to the record's README, "
                        "or mark arithmetic `<!-- not-a-measurement: why -->`:\n" + "\n".join(unheld))


def test_a_planted_figure_its_record_does_not_hold_fails(tmp_path):
    results = tmp_path / "results"
    run = results / "speedup"
    (run / "raw").mkdir(parents=True)
    (run / "README.md").write_text("# Speed-up\n\nCommand: `python bench.py`.\n", encoding="utf-8")
    (run / "raw" / "runs.json").write_text('{"speedup": 1.3017, "tokens_per_s": 12345.6, "wall_s": 104.7}',
                                           encoding="utf-8")
    missing = tmp_path / "MISSING.md"
    link = "[run](results/speedup/README.md)"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(globals(), "RESULTS", results)

        def unheld(text: str) -> list[str]:
            return [line.split(": ", 1)[1] for line in unheld_figures(write_doc(tmp_path, text), missing)]

        assert unheld(f"# Guide\n\nThe engine is **1.30x** faster ({link}).\n") == []
        assert unheld(f"# Guide\n\nThe engine is **1.90x** faster ({link}).\n") == ["1.90x (not in speedup)"]
        assert unheld(f"# Guide\n\nThe engine is 1.31x faster ({link}).\n") != []  # rounded up: not held
        # the section's link backs a block without links of its own, and its record is then checked too
        assert unheld(f"# Guide\n\n## Speed\n\n{link}\n\nIt decodes 12,345 tok/s in 104 s.\n") == []
        assert unheld(f"# Guide\n\n## Speed\n\n{link}\n\nIt decodes 12,346 tok/s in 1047 s.\n") == [
            "12,346 tok/s, 1047 s (not in speedup)"]
        assert unheld(f"# Guide\n\n## Speed\n\n{link}\n\n## Other\n\nIt decodes 9 tok/s.\n") == []  # no record
        (run / "raw" / "steps.csv").write_text("step,tok_s\n1,218.4\n", encoding="utf-8")  # CSV: a comma before it
        assert unheld(f"# Guide\n\n## Speed\n\n{link}\n\nIt decodes 218 tok/s, 2,184 tok/s at best.\n") == [
            "2,184 tok/s (not in speedup)"]  # 218 is held by the CSV's 218.4; 2,184 is not 218.4
        assert unheld(f"# Guide\n\nIt is 1.90x ({link}). <!-- not-a-measurement: 1.9 = 19 / 10 -->\n") == []
        (run / "README.md").write_text("# Speed-up\n\n1.90x = 19.0 / 10.0 (runs.json `a` / `b`).\n",
                                       encoding="utf-8")
        assert unheld(f"# Guide\n\nThe engine is **1.90x** faster ({link}).\n") == []  # a derivation line holds it
        assert unheld_figures(write_doc(run, "It is 1.90x and 7.77x.\n"), missing) == []  # a record's own doc
        assert unheld(f"# Guide\n\nAll 40 killed: **100.0%** ({link}).\n") == ["100.0% (not in speedup)"]
        (run / "raw" / "kills.json").write_text('{"killed": "40/40 = 100%"}', encoding="utf-8")
        assert unheld(f"# Guide\n\nAll 40 killed: **100.0%** ({link}).\n") == []  # 100.0 is held by 100

        # a sub-folder with a README of its own is a record of its own: held where linked, not via its parent
        nested = run / "rerun"
        nested.mkdir()
        (nested / "README.md").write_text("# Re-run\n\n3.71x this time.\n", encoding="utf-8")
        assert unheld(f"# Guide\n\nRe-run: 3.71x ({link}).\n") == ["3.71x (not in speedup)"]
        assert unheld(f"# Guide\n\nRe-run: 3.71x ([run](results/speedup/rerun/README.md)).\n") == []
        (nested / "README.md").unlink()  # ... and without its README it is part of the parent's record
        (nested / "tables.md").write_text("| 3.71x |\n", encoding="utf-8")
        assert unheld(f"# Guide\n\nRe-run: 3.71x ({link}).\n") == []
