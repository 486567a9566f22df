"""`prepare_data`: corpus -> train/val split -> tokenizer -> flat token files, cached on disk.

    source (sources.py)        Dataset["text"], one row per document
    split (split.py)           train / val documents, by a hash of the document index
    tokenizer (tokenizer.py)   trained on <= tokenizer_train_chars of TRAIN, or loaded
    tokenise                   Dataset.map(batched), each document followed by <|eos|>
    flatten                    train.bin / val.bin: every token of the split, back to back

The token files are raw little-endian arrays (uint16 when the vocabulary fits, else uint32)
read back with `np.memmap`, so a training run of any size uses no memory for its data and
starts instantly. Everything lands in `<cache_dir>/<key>/`, where the key hashes every
setting that changes the files (see `_cache_settings`): a second call with the same
settings loads the entry instead of recomputing it (`cache_hit=True`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import datasets
import numpy as np
import pyarrow.compute as pc

from moe.config import DataConfig
from moe.errors import ConfigError
from moe.data import cache
from moe.data.sources import file_sha256, load_source, source_identity
from moe.data.split import SPLIT_SEED, doc_scores, split_indices, split_single_document
from moe.data.tokenizer import SPECIAL_TOKENS, TOKENIZER_FILE, Tokenizer

logger = logging.getLogger(__name__)

TRAIN_FILE, VAL_FILE, TOKENIZER_DIR = "train.bin", "val.bin", "tokenizer"
MAP_BATCH_SIZE = 256  # documents per tokenizer call: big enough to amortise the call, small for memory
MIN_ROWS_PER_PROC = 256  # fewer documents per worker than this: forking costs more than it saves
BPE_MIN_FREQUENCY = 2


@dataclass
class PreparedData:
    """The prepared corpus: where its token files and tokenizer are, and how big they are."""

    train_path: Path
    val_path: Path
    tokenizer: Tokenizer
    tokenizer_dir: Path
    vocab_size: int
    n_train_tokens: int
    n_val_tokens: int
    cache_dir: Path  # this entry's directory, <data.cache_dir>/<key>
    cache_hit: bool
    dtype: str = "uint16"  # numpy dtype of the token files

    def train_tokens(self) -> np.memmap:
        """All training tokens, shape (n_train_tokens,), read-only and memory-mapped."""
        return np.memmap(self.train_path, dtype=self.dtype, mode="r")

    def val_tokens(self) -> np.memmap:
        """All validation tokens, shape (n_val_tokens,), read-only and memory-mapped."""
        return np.memmap(self.val_path, dtype=self.dtype, mode="r")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size < 2**16 else np.uint32)


def prepare_data(cfg: DataConfig, cache_root: Optional[str] = None,
                 tokenizer: Optional[Tokenizer] = None) -> PreparedData:
    """Build (or load from the cache) the tokenised train/val splits of `cfg`'s corpus.

    `cache_root` overrides `cfg.cache_dir`. `tokenizer` tokenises with that tokenizer instead of
    the one `cfg` describes (a resumed run uses its checkpoint's). Concurrent callers with the
    same settings (e.g. one per rank) build the entry once: the others wait on a file lock, then load it.
    """
    root = Path(os.path.expanduser(str(cache_root if cache_root is not None else cfg.cache_dir))).resolve()
    settings = _cache_settings(cfg, tokenizer)
    key = cache.cache_key(settings)
    entry = root / key
    with cache.entry_lock(entry):
        meta = cache.read_meta(entry)
        if meta is not None and _entry_complete(entry, meta):
            try:
                prepared = _from_meta(entry, meta, cache_hit=True)
            except Exception as e:  # e.g. a damaged tokenizer.json (tokenizers raises bare Exception)
                logger.warning("data: cache entry %s is unreadable (%s); rebuilding it", entry, e)
            else:
                logger.info("data: cache hit %s (%d train / %d val tokens)", entry,
                            meta["n_train_tokens"], meta["n_val_tokens"])
                return prepared
        elif entry.exists():
            logger.warning("data: cache entry %s is incomplete; rebuilding it", entry)
        meta = _build(cfg, entry, root, settings, key, tokenizer)
        return _from_meta(entry, meta, cache_hit=False)


# --------------------------------------------------------------------------- cache key / entry


def _cache_settings(cfg: DataConfig, given: Optional[Tokenizer] = None) -> dict:
    """Everything the token files depend on (num_proc and cache_dir do not change them)."""
    if given is not None:
        tokenizer = {"given_sha256": hashlib.sha256(given.backend.to_str().encode()).hexdigest()}
    elif cfg.tokenizer_path:
        tok_file = Path(os.path.expanduser(str(cfg.tokenizer_path)))
        tok_file = tok_file / TOKENIZER_FILE if tok_file.is_dir() else tok_file
        if not tok_file.is_file():
            raise ConfigError(f"data.tokenizer_path={str(cfg.tokenizer_path)!r} is not a tokenizer.json "
                              "file or a directory holding one")
        tokenizer = {"file_sha256": file_sha256(tok_file)}  # content, not path: a retrained file is a miss
    else:
        if cfg.vocab_size <= len(SPECIAL_TOKENS) + 256:
            raise ConfigError(f"data.vocab_size={cfg.vocab_size} must be > {len(SPECIAL_TOKENS) + 256} "
                              "(256 bytes + special tokens + merges)")
        if cfg.tokenizer_train_chars <= 0:
            raise ConfigError(f"data.tokenizer_train_chars={cfg.tokenizer_train_chars} must be > 0")
        tokenizer = {"kind": "bytelevel-bpe", "vocab_size": cfg.vocab_size,
                     "tokenizer_train_chars": cfg.tokenizer_train_chars,
                     "min_frequency": BPE_MIN_FREQUENCY, "special_tokens": list(SPECIAL_TOKENS)}
    if not 0.0 < cfg.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction={cfg.val_fraction} must be in (0, 1)")
    return {"source": source_identity(cfg), "tokenizer": tokenizer, "val_fraction": cfg.val_fraction,
            "max_chars": cfg.max_chars, "split_seed": SPLIT_SEED}


def _entry_complete(entry: Path, meta: dict) -> bool:
    """meta.json exists (written last) and every file it describes has the right size."""
    try:
        itemsize = np.dtype(meta["dtype"]).itemsize
        return (meta.get("cache_version") == cache.CACHE_VERSION
                and (entry / TRAIN_FILE).stat().st_size == meta["n_train_tokens"] * itemsize
                and (entry / VAL_FILE).stat().st_size == meta["n_val_tokens"] * itemsize
                and (entry / TOKENIZER_DIR / TOKENIZER_FILE).is_file())
    except (KeyError, TypeError, OSError):
        return False


def _from_meta(entry: Path, meta: dict, cache_hit: bool) -> PreparedData:
    tok_dir = entry / TOKENIZER_DIR
    tokenizer = Tokenizer.load(tok_dir)
    return PreparedData(train_path=entry / TRAIN_FILE, val_path=entry / VAL_FILE, tokenizer=tokenizer,
                        tokenizer_dir=tok_dir, vocab_size=tokenizer.vocab_size,
                        n_train_tokens=int(meta["n_train_tokens"]), n_val_tokens=int(meta["n_val_tokens"]),
                        cache_dir=entry, cache_hit=cache_hit, dtype=meta["dtype"])


# --------------------------------------------------------------------------- build


def _build(cfg: DataConfig, entry: Path, root: Path, settings: dict, key: str,
           given: Optional[Tokenizer] = None) -> dict:
    t0 = time.perf_counter()
    cache.reset_entry(entry)

    ds = load_source(cfg, hf_cache_dir=str(root / "hf_datasets"))
    train_ds, val_ds = _split(ds, cfg.val_fraction)
    logger.info("data: %d documents -> %d train / %d val (%.1fs)", len(ds), len(train_ds), len(val_ds),
                time.perf_counter() - t0)

    t = time.perf_counter()
    tokenizer = given if given is not None else _get_tokenizer(cfg, train_ds)
    tokenizer.save(entry / TOKENIZER_DIR)
    dtype = token_dtype(tokenizer.vocab_size)
    logger.info("data: tokenizer ready, %d tokens (%.1fs)", tokenizer.vocab_size, time.perf_counter() - t)

    counts = {}
    for split, split_ds, fname in (("train", train_ds, TRAIN_FILE), ("val", val_ds, VAL_FILE)):
        t = time.perf_counter()
        counts[split] = _tokenize_to_file(split_ds, tokenizer, dtype, entry / fname, cfg.num_proc,
                                          scratch=entry / f"ids-{split}.arrow")
        logger.info("data: %s split -> %d tokens in %s (%.1fs)", split, counts[split], entry / fname,
                    time.perf_counter() - t)

    meta = {
        "cache_version": cache.CACHE_VERSION,
        "key": key,
        "settings": settings,
        "dtype": dtype.name,
        "vocab_size": tokenizer.vocab_size,
        "n_train_tokens": counts["train"],
        "n_val_tokens": counts["val"],
        "n_train_docs": len(train_ds),
        "n_val_docs": len(val_ds),
        "build_seconds": round(time.perf_counter() - t0, 3),
    }
    cache.write_json_atomic(entry / cache.META_FILE, meta)  # last: marks the entry complete
    logger.info("data: prepared %s in %.1fs", entry, meta["build_seconds"])
    return meta


def _split(ds: datasets.Dataset, val_fraction: float) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Train / val Datasets, split by document (one document: its head / its tail)."""
    if len(ds) == 1:
        train_text, val_text = split_single_document(ds[0]["text"] or "", val_fraction)
        logger.warning("data: the corpus is a single document; using its last ~%.0f%% (%d characters) "
                       "as the validation split", 100 * val_fraction, len(val_text))
        return (datasets.Dataset.from_dict({"text": [train_text]}, features=ds.features),
                datasets.Dataset.from_dict({"text": [val_text]}, features=ds.features))
    train_idx, val_idx = split_indices(len(ds), val_fraction)
    return ds.select(train_idx), ds.select(val_idx)


def _get_tokenizer(cfg: DataConfig, train_ds: datasets.Dataset) -> Tokenizer:
    if cfg.tokenizer_path:
        try:
            return Tokenizer.load(cfg.tokenizer_path)
        except Exception as e:  # not JSON, not a tokenizer, wrong special tokens
            raise ConfigError(f"data.tokenizer_path={str(cfg.tokenizer_path)!r} could not be used: {e}") from e
    # Train on documents in a fixed shuffled order: when the character budget is smaller than
    # the split, the sample then spans the corpus instead of its alphabetically first files.
    order = np.argsort(doc_scores(len(train_ds), seed=SPLIT_SEED + 1), kind="stable")
    shuffled = train_ds.select(order)

    def texts():
        for batch in shuffled.iter(batch_size=MAP_BATCH_SIZE):
            yield from (t for t in batch["text"] if t)

    return Tokenizer.train(texts(), cfg.vocab_size, max_chars=cfg.tokenizer_train_chars,
                           min_frequency=BPE_MIN_FREQUENCY)


def _encode_batch(batch: dict, tokenizer, eos_id: int) -> dict:
    """Dataset.map worker: token ids of each document, followed by <|eos|>."""
    encodings = tokenizer.encode_batch_fast([t or "" for t in batch["text"]], add_special_tokens=False)
    return {"ids": [e.ids + [eos_id] for e in encodings]}


def _tokenize_to_file(ds: datasets.Dataset, tokenizer: Tokenizer, dtype: np.dtype, out: Path,
                      num_proc: int, scratch: Path) -> int:
    """Tokenise `ds` and write all its tokens back to back to `out`; return how many."""
    n_proc = num_proc if num_proc > 1 and len(ds) >= num_proc * MIN_ROWS_PER_PROC else 1
    features = datasets.Features({"ids": datasets.List(datasets.Value(dtype.name))})
    with _tokenizers_parallelism_off(n_proc > 1):
        ids_ds = ds.map(
            _encode_batch, batched=True, batch_size=MAP_BATCH_SIZE, num_proc=n_proc,
            remove_columns=ds.column_names, features=features,
            fn_kwargs={"tokenizer": tokenizer.backend, "eos_id": tokenizer.eos_id},
            # Our own cache is the source of truth; the Arrow output is scratch in the entry.
            load_from_cache_file=False, cache_file_name=str(scratch),
            desc=f"tokenising {out.stem}",
        )
    tmp = cache.temp_path_beside(out)
    n_tokens = 0
    try:
        with open(tmp, "wb") as f:
            for table in ids_ds.with_format("arrow").iter(batch_size=4096):
                # Flatten list<uint> rows into one array; zero-copy when there are no nulls.
                tokens_N = pc.list_flatten(table["ids"]).to_numpy(zero_copy_only=False).astype(dtype, copy=False)
                f.write(tokens_N.tobytes())
                n_tokens += tokens_N.size
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)  # a crash before this leaves no file named `out`
    finally:
        tmp.unlink(missing_ok=True)  # only left when writing failed
        del ids_ds
        for p in scratch.parent.glob(f"{scratch.stem}*.arrow"):  # the shards of a multi-process map
            p.unlink(missing_ok=True)
    return n_tokens


class _tokenizers_parallelism_off:
    """Set TOKENIZERS_PARALLELISM=false while `Dataset.map` forks workers, then restore it.

    The Rust tokenizer's thread pool does not survive fork(); with the variable unset,
    tokenizers prints a warning in every worker and disables it there anyway.
    """

    def __init__(self, active: bool):
        self.active = active

    def __enter__(self):
        if self.active:
            self.saved = os.environ.get("TOKENIZERS_PARALLELISM")
            os.environ["TOKENIZERS_PARALLELISM"] = "false"

    def __exit__(self, *exc):
        if self.active:
            if self.saved is None:
                os.environ.pop("TOKENIZERS_PARALLELISM", None)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = self.saved
