"""Raw text sources: each returns a `datasets.Dataset` with a single string column "text".

One row is one document. The train/val split (`moe.data.split`) is made per document, so
what counts as a document matters:

- `pystdlib`: one row per standard-library `.py` file, then one per `pydoc` topic. Real,
  varied text that is on every machine, so the whole pipeline runs without a download.
- `text`: a `.txt` file is one document; a `.jsonl`/`.json`/`.parquet` row is one
  document (its `data.text_field` column).
- `hub`: a Hugging Face Hub dataset split, one row per document (`data.text_field`).

`source_identity` describes a source for the cache key: what must change for the cached
token files to be rebuilt.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import logging
import os
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

from moe.config import DataConfig
from moe.errors import ConfigError

if TYPE_CHECKING:  # for annotations: `datasets` (with pandas and pyarrow, ~2 s of CPU) is imported
    import datasets  # inside the functions that use it, so a run whose data is prepared never pays it

logger = logging.getLogger(__name__)

# File extension -> `datasets` packaged builder that reads it.
TEXT_EXTENSIONS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}

# Directories of the standard library that are tests or third-party code, not stdlib source.
_STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test",
                               "__pycache__"})
# The pydoc topics module is a giant dict literal of the topics we add as documents anyway.
_STDLIB_SKIP_FILES = frozenset({os.path.join("pydoc_data", "topics.py")})



# --------------------------------------------------------------------------- pystdlib


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def iter_stdlib_documents() -> Iterator[str]:
    """Yield the stdlib `.py` files (sorted walk, so the order is fixed) then the pydoc topics."""
    root = stdlib_root()
    for dirpath, dirnames, filenames in os.walk(root):
        # Pruning in place stops os.walk from descending; sorting fixes the visit order.
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP_DIRS)
        for fname in sorted(filenames):
            if not fname.endswith(".py"):
                continue
            path = os.path.join(dirpath, fname)
            if os.path.relpath(path, root) in _STDLIB_SKIP_FILES:
                continue
            try:
                with open(path, "rb") as f:
                    text = f.read().decode("utf-8")
            except (OSError, UnicodeDecodeError) as e:
                logger.debug("skipping %s: %s", path, e)
                continue
            if text:
                yield text
    from pydoc_data.topics import topics  # documentation text shipped with CPython

    for name in sorted(topics):
        if topics[name]:
            yield topics[name]


def load_pystdlib(max_chars: Optional[int] = None) -> datasets.Dataset:
    """The running interpreter's standard library as documents (in memory: ~13 MB of text)."""
    import datasets  # here, not at the top: see TYPE_CHECKING above
    texts = []
    total = 0
    for text in iter_stdlib_documents():
        if max_chars is not None and total + len(text) >= max_chars:
            # Stop reading files once the cap is reached instead of truncating afterwards.
            if max_chars - total > 0:
                texts.append(text[: max_chars - total])
            break
        texts.append(text)
        total += len(text)
    logger.info("pystdlib: %d documents from %s", len(texts), stdlib_root())
    return datasets.Dataset.from_dict({"text": texts}, features=datasets.Features({"text": datasets.Value("string")}))


# --------------------------------------------------------------------------- local files


def resolve_paths(path: Any) -> list[Path]:
    """`data.path` (a file, a glob, or a list of them; `~` expanded) -> existing files, in order.

    A glob's matches are sorted so the document order, and so the split, never depends on
    the file system's listing order. A file named twice is kept once.
    """
    if path is None or (isinstance(path, str) and not path.strip()):
        raise ConfigError("data.path is required with data=text (a file, a glob or a list)")
    entries = [path] if isinstance(path, (str, os.PathLike)) else list(path)  # ListConfig too
    if not entries:
        raise ConfigError("data.path is an empty list; give a file, a glob or a list of them")
    files: list[Path] = []
    for entry in entries:
        pattern = os.path.expanduser(str(entry))
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise ConfigError(f"data.path={str(entry)!r} matched no files")
        elif os.path.isdir(pattern):
            raise ConfigError(f"data.path={str(entry)!r} is a directory; use a glob such as "
                              f"'{os.path.join(str(entry), '*.txt')}'")
        elif not os.path.isfile(pattern):
            raise ConfigError(f"data.path={str(entry)!r} does not exist")
        else:
            matches = [pattern]
        files.extend(Path(m).resolve() for m in matches)
    files = list(dict.fromkeys(files))  # de-duplicate, keep the first occurrence's position
    for f in files:
        _builder_for(f)  # fail before loading anything if one extension is unsupported
    return files


def _builder_for(file: Path) -> str:
    ext = file.suffix.lower()
    if ext not in TEXT_EXTENSIONS:
        raise ConfigError(f"data.path: unsupported file extension {ext or '(none)'!r} of {str(file)!r}; "
                          f"allowed: {sorted(TEXT_EXTENSIONS)}")
    return TEXT_EXTENSIONS[ext]


def load_text_files(files: list[Path], text_field: str, hf_cache_dir: Optional[str]) -> datasets.Dataset:
    """Load local files through the `datasets` packaged builders, keeping their order.

    Consecutive files of the same kind are loaded with one `load_dataset` call; a mixed
    list is loaded in runs and concatenated, which keeps the given file order.
    """
    import datasets  # here, not at the top: see TYPE_CHECKING above
    parts = []
    for builder, group in itertools.groupby(files, key=_builder_for):
        data_files = [str(f) for f in group]
        kwargs = {"sample_by": "document"} if builder == "text" else {}  # one file = one document
        try:
            ds = datasets.load_dataset(builder, data_files=data_files, split="train",
                                       cache_dir=hf_cache_dir, **kwargs)
        except Exception as e:  # empty or malformed files surface as assorted builder errors
            raise ConfigError(f"data.path: could not read {data_files} as {builder}: "
                              f"{type(e).__name__}: {e}") from e
        if builder != "text":
            ds = _select_text_column(ds, text_field, f"{data_files[0]!r}")
        parts.append(ds)
    ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    logger.info("text: %d documents from %d file(s)", len(ds), len(files))
    return ds


def _select_text_column(ds: datasets.Dataset, text_field: str, where: str) -> datasets.Dataset:
    """Keep only `text_field`, renamed to "text"; it must exist and hold strings."""
    import datasets  # here, not at the top: see TYPE_CHECKING above
    if text_field not in ds.column_names:
        raise ConfigError(f"data.text_field={text_field!r} is not a column of {where}; "
                          f"columns: {ds.column_names}")
    feature = ds.features[text_field]
    if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")):
        raise ConfigError(f"data.text_field={text_field!r} of {where} holds {feature}, not strings")
    ds = ds.select_columns([text_field])
    if text_field != "text":
        ds = ds.rename_column(text_field, "text")
    return ds


# --------------------------------------------------------------------------- hub


def load_hub(cfg: DataConfig) -> datasets.Dataset:
    """A Hub dataset split (downloads into the standard Hugging Face cache, shared across projects)."""
    import datasets  # here, not at the top: see TYPE_CHECKING above
    if not cfg.hub_name:
        raise ConfigError("data.hub_name is required with data=hub (e.g. roneneldan/TinyStories)")
    ds = datasets.load_dataset(cfg.hub_name, cfg.hub_config, split=cfg.hub_split)
    return _select_text_column(ds, cfg.text_field, f"hub dataset {cfg.hub_name!r}")


# --------------------------------------------------------------------------- entry points


def load_source(cfg: DataConfig, hf_cache_dir: Optional[str] = None) -> datasets.Dataset:
    """The configured corpus as a Dataset with one "text" column, capped at `max_chars`.

    `hf_cache_dir` is where `datasets` keeps its Arrow copy of local files (None: its default).
    """
    if cfg.max_chars is not None and cfg.max_chars <= 0:
        raise ConfigError(f"data.max_chars={cfg.max_chars} must be > 0 (or null for everything)")
    if cfg.name == "pystdlib":
        return load_pystdlib(cfg.max_chars)  # caps while reading
    if cfg.name == "text":
        ds = load_text_files(resolve_paths(cfg.path), cfg.text_field, hf_cache_dir)
    elif cfg.name == "hub":
        ds = load_hub(cfg)
    else:
        raise ConfigError(f"data.name={cfg.name!r} is not allowed; choose one of ['pystdlib', 'text', 'hub']")
    return truncate_chars(ds, cfg.max_chars)


def truncate_chars(ds: datasets.Dataset, max_chars: Optional[int]) -> datasets.Dataset:
    """Keep documents in order until `max_chars` characters; the last one is cut to fit."""
    import datasets  # here, not at the top: see TYPE_CHECKING above
    import pyarrow.compute as pc
    if max_chars is None or len(ds) == 0:
        return ds
    col = ds.with_format("arrow")[:]["text"]
    lengths = pc.fill_null(pc.utf8_length(col), 0).to_numpy(zero_copy_only=False)
    ends = lengths.cumsum()  # ends[i] = characters in documents 0..i
    n_full = int((ends <= max_chars).sum())
    if n_full == len(ds):
        return ds
    kept = ds.select(range(n_full))
    remaining = max_chars - (int(ends[n_full - 1]) if n_full else 0)
    if remaining > 0:
        partial = col[n_full].as_py()[:remaining]
        tail = datasets.Dataset.from_dict({"text": [partial]}, features=kept.features)
        kept = datasets.concatenate_datasets([kept, tail])
    return kept


def source_identity(cfg: DataConfig) -> dict:
    """What identifies the source's content, for the cache key (cheap: no file is read)."""
    if cfg.name == "pystdlib":
        return {"name": "pystdlib", "python": sys.version, "stdlib": stdlib_root()}
    if cfg.name == "text":
        files = []
        for f in resolve_paths(cfg.path):
            st = f.stat()
            files.append([str(f), st.st_size, st.st_mtime_ns])
        # text_field only matters for the column-based formats.
        uses_field = any(_builder_for(Path(f[0])) != "text" for f in files)
        return {"name": "text", "files": files, "text_field": cfg.text_field if uses_field else None}
    if cfg.name == "hub":
        # No network call for a revision: a changed remote dataset needs a new cache_dir.
        return {"name": "hub", "hub_name": cfg.hub_name, "hub_config": cfg.hub_config,
                "hub_split": cfg.hub_split, "text_field": cfg.text_field}
    raise ConfigError(f"data.name={cfg.name!r} is not allowed; choose one of ['pystdlib', 'text', 'hub']")


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
