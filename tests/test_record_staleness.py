"""A recorded figure is not older than the code it measures by more than its record allows (issue 29, item 7).

Every record folder under docs/results/ (raw `.json`/`.jsonl` data and a README.md, see
tests/test_docs.py) has a `## Staleness` section in its README.md, one list item per field:

    ## Staleness

    - commit: `11debea`
    - measures: `moe/quant/`, `eval/tasks/quant_sweep.py`
    - stale after: 15 commits
    - still holds at `abc1234`: <why the figures are still those of the code at abc1234>

`commit` is the commit whose code made the figures; `measures` the files and folders whose code
decides them (each must exist); `stale after` how much that code may change before the figures must
be re-run: `N commits` (commits since `commit` that touch a measured path) or `N lines` (lines added
plus removed in the measured paths between `commit` and HEAD). Past it the test fails, unless a
`still holds at <commit>` item says why the figures still hold: the count then starts again from
that commit (a reviewer who checked the change restarts the clock; nothing waives it for good), or
docs/results/MISSING.md lists the record under `## Stale records` (a link to its README.md), to be
re-run. A record listed there that is not stale fails too, so the list stays true.

Cost: one `git rev-list HEAD` for the whole test, then one git call per record. It needs the
history: outside a git checkout, or in a shallow clone, it skips and says so (CI clones in full).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
MISSING = RESULTS / "MISSING.md"
STALE_SECTION = "stale records"
SECTION = "staleness"
SHA = r"[0-9a-f]{7,40}"
FIELD = re.compile(r"^\s*[-*]\s+(commit|measures|stale after|still holds at\s+`?(" + SHA + r")`?)\s*:\s*(.*?)\s*$",
                   re.IGNORECASE)
CODE = re.compile(r"`([^`]+)`")
LIMIT = re.compile(r"^(\d+)\s+(commits?|lines?)$")


class RecordError(ValueError):
    """A record README whose staleness fields are missing or malformed."""


@dataclass(frozen=True)
class Staleness:
    commit: str  # the figures' code
    measures: tuple[str, ...]  # repository paths (files or folders) that decide the figures
    limit: int
    unit: str  # "commits" | "lines"
    checked_at: Optional[str] = None  # a later commit at which a reviewer said the figures still hold
    why: str = ""

    @property
    def since(self) -> str:
        return self.checked_at or self.commit


def section_lines(text: str, name: str = SECTION) -> list[str]:
    """The lines under the `## <name>` heading (any level), up to the next heading, outside fences."""
    out, inside, fence = [], False, False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        heading = None if fence else re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if heading:
            inside = heading.group(1).strip().lower() == name
            continue
        if inside:
            out.append(line)
    return out


def parse(text: str, where: str = "README.md") -> Staleness:
    """The `## Staleness` fields of one record README; RecordError naming the field otherwise."""
    fields: dict[str, str] = {}
    checked: list[tuple[str, str]] = []
    for line in section_lines(text):
        m = FIELD.match(line)
        if not m:
            continue
        key = m.group(1).lower()
        if key.startswith("still holds"):
            checked.append((m.group(2).lower(), m.group(3)))
        else:
            fields[key] = m.group(3)
    for key in ("commit", "measures", "stale after"):
        if key not in fields:
            raise RecordError(f"{where}: the '## Staleness' section has no '- {key}:' item")
    commit = fields["commit"].strip("` ").lower()
    if not re.fullmatch(SHA, commit):
        raise RecordError(f"{where}: commit {fields['commit']!r} is not a commit id (7-40 hex digits)")
    measures = tuple(p.strip() for p in CODE.findall(fields["measures"]))
    if not measures:
        raise RecordError(f"{where}: measures names no path (give backticked paths: `moe/quant/`, `benchmarks/x.py`)")
    limit = LIMIT.match(fields["stale after"].strip().lower())
    if not limit:
        raise RecordError(f"{where}: stale after {fields['stale after']!r}: write 'N commits' or 'N lines'")
    unit = "commits" if limit.group(2).startswith("commit") else "lines"
    checked_at, why = (checked[-1] if checked else (None, ""))
    if checked_at is not None and not why.strip():
        raise RecordError(f"{where}: 'still holds at {checked_at}' gives no reason")
    return Staleness(commit, measures, int(limit.group(1)), unit, checked_at, why.strip())


def record_readmes() -> list[Path]:
    """README.md of every record folder: docs/results/<name>/ with raw .json/.jsonl data beside it."""
    out = []
    for folder in sorted(p for p in RESULTS.iterdir() if p.is_dir()):
        files = [f for f in folder.rglob("*") if f.is_file()]
        has_data = any(f.suffix in {".json", ".jsonl"} and f.name != "record.json" for f in files)
        if has_data and (folder / "README.md").is_file():
            out.append(folder / "README.md")
    return out


def listed_stale(missing: Path = MISSING) -> set[Path]:
    """The record READMEs that MISSING.md's `## Stale records` section links to (resolved paths)."""
    if not missing.is_file():
        return set()
    text = "\n".join(section_lines(missing.read_text(encoding="utf-8"), STALE_SECTION))
    return {(missing.parent / t.split("#", 1)[0]).resolve() for t in re.findall(r"\]\(([^)\s]+)\)", text)
            if "://" not in t and t.split("#", 1)[0].endswith("README.md")}


def git(*args: str, repo: Path = REPO) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def history_or_skip_reason(repo: Path = REPO) -> tuple[Optional[set[str]], str]:
    """Every commit reachable from HEAD (full ids), or None and why the check cannot run here."""
    if shutil.which("git") is None:
        return None, "git is not installed"
    try:
        if git("rev-parse", "--is-inside-work-tree", repo=repo).strip() != "true":
            return None, f"{repo} is not a git work tree"
        if git("rev-parse", "--is-shallow-repository", repo=repo).strip() == "true":
            return None, "a shallow clone: the records' commits may be missing (clone in full or `git fetch --unshallow`)"
        return set(git("rev-list", "HEAD", repo=repo).split()), ""
    except subprocess.CalledProcessError as e:
        return None, f"not a git checkout with history ({e.stderr.strip()[:200]})"


@lru_cache(maxsize=1)
def _history() -> tuple[Optional[frozenset[str]], str]:
    commits, why = history_or_skip_reason()
    return (frozenset(commits) if commits is not None else None), why


def resolve(short: str, history: set[str] | frozenset[str]) -> Optional[str]:
    """The one commit of HEAD's history that `short` abbreviates (None if none or ambiguous)."""
    hits = [c for c in history if c.startswith(short)]
    return hits[0] if len(hits) == 1 else None


def changed_since(rec: Staleness, since: str, repo: Path = REPO) -> int:
    """Commits touching the measured paths since `since`, or lines added + removed in them: one git call."""
    paths = ["--", *rec.measures]
    if rec.unit == "commits":
        return int(git("rev-list", "--count", f"{since}..HEAD", *paths, repo=repo).strip())
    stat = git("diff", "--shortstat", since, "HEAD", *paths, repo=repo)
    return sum(int(n) for n in re.findall(r"(\d+) (?:insertion|deletion)", stat))


def problems(readme: Path, history, repo: Path = REPO, listed: frozenset[Path] | set[Path] = frozenset()) -> list[str]:
    """What is wrong with one record's staleness fields, or its age; [] when it holds.

    `listed`: the READMEs MISSING.md lists as stale (to be re-run): past its limit such a record is
    accepted, within it the listing is the error."""
    where = str(readme.relative_to(repo)) if readme.is_relative_to(repo) else str(readme)
    try:
        rec = parse(readme.read_text(encoding="utf-8"), where)
    except RecordError as e:
        return [str(e)]
    out = [f"{where}: measures `{p}`, which does not exist (renamed? update the record)"
           for p in rec.measures if not (repo / p).exists()]
    full = {}
    for label, sha in (("commit", rec.commit), ("still holds at", rec.checked_at)):
        if sha is None:
            continue
        full[label] = resolve(sha, history)
        if full[label] is None:
            out.append(f"{where}: {label} {sha} is not (unambiguously) in HEAD's history: name the commit as it is "
                       "on this branch (a rebase changes commit ids)")
    if out:
        return out
    n = changed_since(rec, full.get("still holds at") or full["commit"], repo)
    is_listed = readme.resolve() in listed
    if is_listed and n <= rec.limit:
        out.append(f"{where}: MISSING.md lists it as stale, but {n} {rec.unit} changed its code (it allows "
                   f"{rec.limit}): remove the row")
    elif n > rec.limit and not is_listed:
        since = f"{rec.since} (still holds at)" if rec.checked_at else rec.since
        out.append(f"{where}: {n} {rec.unit} changed {', '.join(rec.measures)} since {since}; the record allows "
                   f"{rec.limit}: re-run it, add '- still holds at <commit>: <why>' after checking the change, "
                   "or list it under '## Stale records' in docs/results/MISSING.md")
    return out


def test_every_record_names_its_commit_and_what_it_measures():
    bad = []
    for readme in record_readmes():
        try:
            rec = parse(readme.read_text(encoding="utf-8"), str(readme.relative_to(REPO)))
        except RecordError as e:
            bad.append(str(e))
            continue
        bad += [f"{readme.relative_to(REPO)}: measures `{p}`, which does not exist" for p in rec.measures
                if not (REPO / p).exists()]
    assert not bad, "record READMEs without valid staleness fields (see this file's docstring):\n" + "\n".join(bad)


def test_no_record_is_older_than_its_code_allows():
    history, why = _history()
    if history is None:
        pytest.skip(f"record staleness needs the git history: {why}")
    listed = listed_stale()
    readmes = record_readmes()
    unknown = [str(p) for p in listed if p not in {r.resolve() for r in readmes}]
    assert not unknown, "MISSING.md's '## Stale records' links READMEs that are no record:\n" + "\n".join(unknown)
    stale = [p for readme in readmes for p in problems(readme, history, listed=listed)]
    assert not stale, "stale records:\n" + "\n".join(stale)


# ---------------------------------------------------------------- the rule on a throw-away repository

README = """# A run

Figures: 12 ms.

## Staleness

- commit: `{commit}`
- measures: `pkg/a.py`, `pkg/sub/`
- stale after: {limit}
{extra}
## Next section

- commit: `0000000` (not a field: another section)
"""


def commit_file(repo: Path, rel: str, text: str) -> str:
    path = repo / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    git("add", rel, repo=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"edit {rel}", repo=repo)
    return git("rev-parse", "HEAD", repo=repo).strip()


@pytest.fixture
def tiny_repo(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", repo=repo)
    base = commit_file(repo, "pkg/a.py", "x = 1\n")
    commit_file(repo, "pkg/sub/b.py", "y = 1\n")
    return repo, base


def write_readme(repo: Path, commit: str, limit: str, extra: str = "") -> Path:
    readme = repo / "README.md"
    readme.write_text(README.format(commit=commit, limit=limit, extra=extra), encoding="utf-8")
    return readme


def test_parse_reads_the_section_only_and_refuses_a_malformed_field():
    rec = parse(README.format(commit="ABCDEF1", limit="3 commits", extra=""))
    assert rec == Staleness("abcdef1", ("pkg/a.py", "pkg/sub/"), 3, "commits")
    with_check = parse(README.format(commit="abcdef1", limit="40 lines", extra="- still holds at `1234567`: docs only\n"))
    assert (with_check.unit, with_check.limit, with_check.since, with_check.why) == ("lines", 40, "1234567", "docs only")
    for text, field in [(README.format(commit="abcdef1", limit="soon", extra=""), "stale after"),
                        (README.format(commit="main", limit="3 commits", extra=""), "commit"),
                        (README.format(commit="abcdef1", limit="3 commits", extra="- still holds at 1234567:\n"),
                         "gives no reason"),
                        ("# A run\n\nno section\n", "no '- commit:'"),
                        (README.format(commit="abcdef1", limit="3 commits", extra="").replace("`pkg/a.py`, `pkg/sub/`",
                                                                                          "pkg/a.py"), "measures")]:
        with pytest.raises(RecordError, match=field):
            parse(text)


def test_a_record_goes_stale_past_its_commits_and_a_checked_reason_restarts_the_count(tiny_repo):
    repo, base = tiny_repo
    readme = write_readme(repo, base[:9], "1 commits")
    history = set(git("rev-list", "HEAD", repo=repo).split())
    assert problems(readme, history, repo) == []  # one measured commit since (pkg/sub/b.py): allowed
    commit_file(repo, "other.txt", "not measured\n")  # outside the measured paths: does not count
    assert problems(readme, set(git("rev-list", "HEAD", repo=repo).split()), repo) == []
    head = commit_file(repo, "pkg/a.py", "x = 2\n")
    history = set(git("rev-list", "HEAD", repo=repo).split())
    (msg,) = problems(readme, history, repo)
    assert "2 commits changed pkg/a.py, pkg/sub/" in msg and "allows 1" in msg
    write_readme(repo, base[:9], "1 commits", f"- still holds at `{head[:8]}`: only a rename inside a loop\n")
    assert problems(readme, history, repo) == []  # counted from the checked commit: 0 since
    commit_file(repo, "pkg/sub/c.py", "z = 1\n")
    commit_file(repo, "pkg/sub/c.py", "z = 2\n")
    (msg,) = problems(readme, set(git("rev-list", "HEAD", repo=repo).split()), repo)
    assert f"since {head[:8]} (still holds at)" in msg
    missing = repo / "MISSING.md"
    missing.write_text(f"# x\n\n## Stale records\n\n| record | why |\n|---|---|\n| [r]({readme.name}) | re-run |\n",
                       encoding="utf-8")
    listed = listed_stale(missing)
    assert listed == {readme.resolve()}
    assert problems(readme, set(git("rev-list", "HEAD", repo=repo).split()), repo, listed) == []  # listed: accepted
    write_readme(repo, base[:9], "9 commits")
    (msg,) = problems(readme, set(git("rev-list", "HEAD", repo=repo).split()), repo, listed)
    assert "lists it as stale, but 4 commits changed its code" in msg  # listed but fresh: the row must go
    missing.write_text(f"# x\n\n## Other\n\n[r]({readme.name})\n", encoding="utf-8")
    assert listed_stale(missing) == set()  # only the Stale records section counts


def test_a_lines_limit_counts_added_and_removed_lines(tiny_repo):
    repo, base = tiny_repo
    commit_file(repo, "pkg/a.py", "x = 2\ny = 3\n")  # 1 removed + 2 added, plus b.py's 1 added since base
    history = set(git("rev-list", "HEAD", repo=repo).split())
    assert changed_since(parse(README.format(commit=base, limit="4 lines", extra="")), base, repo) == 4
    assert problems(write_readme(repo, base, "4 lines"), history, repo) == []
    (msg,) = problems(write_readme(repo, base, "3 lines"), history, repo)
    assert "4 lines changed" in msg


def test_a_commit_outside_the_history_or_a_missing_path_is_named(tiny_repo):
    repo, base = tiny_repo
    history = set(git("rev-list", "HEAD", repo=repo).split())
    (msg,) = problems(write_readme(repo, "deadbeef", "5 commits"), history, repo)
    assert "commit deadbeef is not (unambiguously) in HEAD's history" in msg
    readme = write_readme(repo, base, "5 commits")
    readme.write_text(readme.read_text().replace("`pkg/sub/`", "`pkg/gone.py`"), encoding="utf-8")
    (msg,) = problems(readme, history, repo)
    assert "measures `pkg/gone.py`, which does not exist" in msg


def test_outside_a_git_checkout_or_in_a_shallow_clone_it_skips_with_a_reason(tmp_path, tiny_repo):
    plain = tmp_path / "plain"
    plain.mkdir()
    history, why = history_or_skip_reason(plain)
    assert history is None and why
    repo, _ = tiny_repo
    commit_file(repo, "pkg/a.py", "x = 3\n")
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True,
                   capture_output=True)
    history, why = history_or_skip_reason(shallow)
    assert history is None and "shallow clone" in why
    history, why = history_or_skip_reason(repo)
    assert history is not None and len(history) == 3 and why == ""
