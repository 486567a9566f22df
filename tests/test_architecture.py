"""The layers of docs/architecture.md hold: the import contracts in pyproject.toml pass
(`lint-imports`), a planted violation is caught, function-local imports of project modules are
deliberate (commented), no source file outgrows ~400 lines and no function in the library
packages outgrows 80."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("moe", "kernels", "eval", "benchmarks")
MAX_LINES = 400
MAX_FUNCTION_LINES = 80
FUNCTION_PACKAGES = ("moe", "kernels", "eval")  # benchmarks are scripts: their reports may read top to bottom


def source_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py") if "__pycache__" not in p.parts)


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the tree at `root` (its pyproject.toml, its packages first on the path)."""
    code = "from importlinter.cli import lint_imports; raise SystemExit(lint_imports(no_cache=True, no_logo=True))"
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(root)})


def test_import_contracts_hold():
    p = lint_imports(REPO)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "BROKEN" not in p.stdout and "0 broken" in p.stdout


@pytest.mark.slow
@pytest.mark.parametrize("where, line, contract", [
    # The model reaching up into the engine: breaks the layers and the model's own contract.
    ("moe/model.py", "import moe.engine.core.llm", "The model imports no engine"),
    # A kernel importing the model.
    ("kernels/__init__.py", "import moe.model", "Kernels know nothing of the model"),
    # The config schema importing a variant (the 17-file cycle this redesign removed).
    ("moe/config/schema.py", "import moe.routing.routers", "Config, errors and the registry import nothing"),
    # A cycle between two data modules (data stays below the model, so only the cycle check sees it).
    ("moe/data/split.py", "import moe.data.pipeline", "No import cycles"),
])
def test_a_planted_violation_is_caught(tmp_path, where, line, contract):
    for name in (*PACKAGES, "pyproject.toml"):
        src = REPO / name
        (shutil.copytree(src, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
         if src.is_dir() else shutil.copy(src, tmp_path / name))
    target = tmp_path / where
    target.write_text(target.read_text() + f"\n{line}  # planted by tests/test_architecture.py\n")
    p = lint_imports(tmp_path)
    assert p.returncode != 0, p.stdout[-2000:]
    broken = [ln for ln in p.stdout.splitlines() if ln.rstrip().endswith("BROKEN")
              or "BROKEN (" in ln]
    assert any(contract in ln for ln in p.stdout.splitlines() if "BROKEN" in ln), p.stdout[-3000:]
    assert broken


def _local_imports(path: Path):
    """(line number, module, has_comment) of every import of a project module inside a function."""
    text = path.read_text()
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.ImportFrom) and sub.level == 0 and sub.module:
                mod = sub.module
            elif isinstance(sub, ast.Import):
                mod = sub.names[0].name
            else:
                continue
            if mod.split(".")[0] in PACKAGES:
                around = lines[max(0, sub.lineno - 3):sub.lineno]
                yield sub.lineno, mod, any("lazy" in ln.lower() for ln in around)


def test_function_local_imports_of_project_modules_are_deliberately_lazy():
    """A project import inside a function is for a heavy optional dependency only, and says so
    ("lazy: ..." on its line or the two above); never to dodge a cycle."""
    offenders = [f"{p.relative_to(REPO)}:{n}: {mod}" for p in source_files()
                 for n, mod, commented in _local_imports(p) if not commented]
    assert not offenders, "function-local project imports without a 'lazy: why' comment:\n" + "\n".join(offenders)


def test_no_source_file_outgrows_the_limit():
    long = [f"{p.relative_to(REPO)}: {n} lines" for p in source_files()
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"files over {MAX_LINES} lines (split them by concern):\n" + "\n".join(long)


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(qualified name, lines from `def` to its last line) of every function or method in `path`
    longer than `limit`; nested functions are counted on their own and inside their parent."""
    out = []

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                n = child.end_lineno - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and n > limit:
                    out.append((name, n))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), "")
    return out


def test_long_functions_finds_methods_and_nested_functions(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(4))
    src = tmp_path / "m.py"
    src.write_text(f"class A:\n    def short(self):\n        pass\n\n    def long(self):\n{body}\n"
                   f"        def inner():\n{body.replace('        ', '            ')}\n")
    assert long_functions(src, limit=5) == [("A.long", 10)]
    assert [name for name, _ in long_functions(src, limit=4)] == ["A.long", "A.long.inner"]
    assert long_functions(src, limit=10) == []


def test_no_function_outgrows_the_limit():
    files = [p for p in source_files() if p.relative_to(REPO).parts[0] in FUNCTION_PACKAGES]
    long = [f"{p.relative_to(REPO)}::{name}: {n} lines" for p in files for name, n in long_functions(p)]
    assert not long, (f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n"
                      + "\n".join(long))
