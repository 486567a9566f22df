"""Streaming preparation (`data.streaming=true`): documents are read one batch at a time and
their tokens appended to the shards, so nothing the size of the corpus is ever held or copied.

Hub datasets and local files take the same road: `datasets.load_dataset(..., streaming=True)`
gives an `IterableDataset` for either (a hub split is fetched file by file as it is read, never
downloaded whole into the Arrow cache first), and everything after that is this module's one
code path. The local road is what the tests run (no network here).

Same results as the in-memory path where it can be: the split is the same per-document hash
(split.py: document i goes to val when its score is below `val_fraction`), each document is
followed by <|eos|>, the order is the corpus order. Two differences, both in the cache key
(`streaming: true`), so the two paths never share an entry:
- a trained tokenizer sees the first `tokenizer_train_chars` of the training documents (the
  in-memory path samples them across the corpus: that needs random access);
- the in-memory path moves one document when the hash puts all of a small corpus on one side;
  a stream cannot take back what it wrote, so an empty split is an error instead.
Tokenising runs `encode_batch_fast` on batches of documents: the Rust tokenizer spreads each
batch over the machine's cores itself, no worker processes to fork.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import numpy as np

from moe.config import DataConfig
from moe.data.shards import ShardWriter
from moe.data.sources import _builder_for, iter_stdlib_documents, resolve_paths
from moe.data.split import doc_scores_at, split_single_document
from moe.data.tokenizer import Tokenizer
from moe.errors import ConfigError

if TYPE_CHECKING:  # for annotations: `datasets` (with pandas and pyarrow, ~2 s of CPU) is imported
    import datasets  # inside the functions that use it, so a run whose data is prepared never pays it

logger = logging.getLogger(__name__)

BATCH_DOCS = 1024  # documents per tokenizer call


def stream_source(cfg: DataConfig) -> datasets.IterableDataset:
    """The configured corpus as an IterableDataset (rows hold `data.text_field`, or "text")."""
    import datasets  # here, not at the top: see TYPE_CHECKING above
    if cfg.name == "hub":
        if not cfg.hub_name:
            raise ConfigError("data.hub_name is required with data=hub (e.g. roneneldan/TinyStories)")
        return datasets.load_dataset(cfg.hub_name, cfg.hub_config, split=cfg.hub_split, streaming=True)
    if cfg.name == "text":
        parts = []
        for builder, group in itertools.groupby(resolve_paths(cfg.path), key=_builder_for):
            kwargs = {"sample_by": "document"} if builder == "text" else {}  # one .txt file = one document
            parts.append(datasets.load_dataset(builder, data_files=[str(f) for f in group], split="train",
                                               streaming=True, **kwargs))
        return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if cfg.name == "pystdlib":
        return datasets.IterableDataset.from_generator(lambda: ({"text": t} for t in iter_stdlib_documents()))
    raise ConfigError(f"data.name={cfg.name!r} is not allowed; choose one of ['pystdlib', 'text', 'hub']")


def iter_texts(cfg: DataConfig) -> Iterator[str]:
    """The documents' texts in corpus order, capped at `data.max_chars` (the last one cut to fit)."""
    field = cfg.text_field if cfg.name != "pystdlib" else "text"
    is_txt = cfg.name == "text" and all(_builder_for(Path(f)) == "text" for f in resolve_paths(cfg.path))
    field = "text" if is_txt else field  # .txt files have one column, "text"
    total = 0
    for row in stream_source(cfg):
        if field not in row:
            raise ConfigError(f"data.text_field={field!r} is not a column of the stream; columns: {sorted(row)}")
        text = row[field] or ""
        if not isinstance(text, str):
            raise ConfigError(f"data.text_field={field!r} holds {type(text).__name__}, not strings")
        if cfg.max_chars is not None and total + len(text) >= cfg.max_chars:
            if cfg.max_chars - total > 0:
                yield text[: cfg.max_chars - total]
            return
        total += len(text)
        yield text


def split_stream(texts: Iterator[str], val_fraction: float) -> Iterator[tuple[bool, str]]:
    """(is_val, text) per document: the split's per-index hash, in chunks; a corpus of a single
    document is cut head (train) / tail (val) like the in-memory path."""
    texts = iter(texts)
    head = list(itertools.islice(texts, 2))
    if len(head) == 1:
        train_text, val_text = split_single_document(head[0], val_fraction)
        logger.warning("data: the corpus is a single document; using its last ~%.0f%% as the validation split",
                       100 * val_fraction)
        yield False, train_text
        yield True, val_text
        return
    i = 0
    for chunk in _chunks(itertools.chain(head, texts), BATCH_DOCS):
        scores_N = doc_scores_at(np.arange(i, i + len(chunk), dtype=np.uint64))
        yield from zip((scores_N < val_fraction).tolist(), chunk)
        i += len(chunk)


def _chunks(it, n: int):
    it = iter(it)
    while chunk := list(itertools.islice(it, n)):
        yield chunk


def train_texts(cfg: DataConfig) -> Iterator[str]:
    """The training documents of the stream (for a tokenizer to learn from)."""
    return (t for is_val, t in split_stream(iter_texts(cfg), cfg.val_fraction) if not is_val and t)


def tokenize_stream(cfg: DataConfig, tokenizer: Tokenizer, writers: dict[str, ShardWriter]) -> dict[str, int]:
    """Tokenise the stream into `writers` ("train", "val"); returns the documents of each."""
    n_docs = {"train": 0, "val": 0}
    eos = tokenizer.eos_id
    for chunk in _chunks(split_stream(iter_texts(cfg), cfg.val_fraction), BATCH_DOCS):
        encodings = tokenizer.backend.encode_batch_fast([t for _, t in chunk], add_special_tokens=False)
        for split in ("train", "val"):
            ids = [e.ids + [eos] for (is_val, _), e in zip(chunk, encodings) if is_val == (split == "val")]
            if ids:
                writers[split].write(np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64))
                n_docs[split] += len(ids)
    empty = [s for s, n in n_docs.items() if n == 0]
    if empty:
        raise ConfigError(f"data: the {empty[0]} split of the stream is empty ({n_docs['train']} train / "
                          f"{n_docs['val']} val documents); use a larger corpus, another data.val_fraction, "
                          "or data.streaming=false (which moves one document over)")
    return n_docs


def streaming_tokenizer(cfg: DataConfig, given: Optional[Tokenizer], train_bpe) -> Tokenizer:
    """`given`, else `data.tokenizer_path`, else `train_bpe(texts)` on the stream's training documents."""
    if given is not None:
        return given
    if cfg.tokenizer_path:
        try:
            return Tokenizer.load(cfg.tokenizer_path)
        except Exception as e:  # not JSON, not a tokenizer, wrong special tokens
            raise ConfigError(f"data.tokenizer_path={str(cfg.tokenizer_path)!r} could not be used: {e}") from e
    return train_bpe(train_texts(cfg))
