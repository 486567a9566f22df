"""`prepare_data`: corpus -> train/val split -> tokenizer -> flat token files, cached on disk.

    source (sources.py)        Dataset["text"], one row per document
    split (split.py)           train / val documents, by a hash of the document index
    tokenizer (tokenizer.py)   trained on <= tokenizer_train_chars of TRAIN, or loaded
    tokenise                   Dataset.map(batched), each document followed by <|eos|>
    flatten                    train-00000.bin ... / val-00000.bin ...: every token of the split,
                               back to back, in shards of data.shard_tokens (shards.py)

With `data.streaming=true` the corpus is read as a stream instead (streaming.py: hub datasets
without downloading the whole split first; local files the same way), into the same files.
`python -m moe.data.prepare` runs this step on its own (prepare.py); distributed training
only reads a prepared entry (`require_prepared=True`) and never builds one.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np

from moe.config import DataConfig
from moe.errors import ConfigError
from moe.data import cache, streaming
from moe.data.chat.prepare import prepare_chat
from moe.data.shards import ShardWriter, open_split, shards_complete
from moe.data.sources import file_sha256, load_source, source_identity
from moe.data.split import SPLIT_SEED, doc_scores, split_indices, split_single_document
from moe.data.tokenizer import SPECIAL_TOKENS, TOKENIZER_FILE, Tokenizer

if TYPE_CHECKING:  # for annotations: `datasets` (with pandas and pyarrow, ~2 s of CPU) is imported
    import datasets  # inside the functions that use it, so a run whose data is prepared never pays it

logger = logging.getLogger(__name__)

TRAIN_FILE, VAL_FILE, TOKENIZER_DIR = "train.bin", "val.bin", "tokenizer"
MAP_BATCH_SIZE = 256  # documents per tokenizer call: big enough to amortise the call, small for memory
MIN_ROWS_PER_PROC = 256  # fewer documents per worker than this: forking costs more than it saves
BPE_MIN_FREQUENCY = 2


@dataclass
class PreparedData:
    """The prepared corpus: where its token files and tokenizer are, and how big they are."""

    train_paths: list[Path]  # the split's shards, in order
    val_paths: list[Path]
    tokenizer: Tokenizer
    tokenizer_dir: Path
    vocab_size: int
    n_train_tokens: int
    n_val_tokens: int
    cache_dir: Path  # this entry's directory, <data.cache_dir>/<key>
    cache_hit: bool
    dtype: str = "uint16"  # numpy dtype of the token files
    meta: dict = field(default_factory=dict)  # the entry's meta.json (its "shards" index)

    def train_tokens(self):
        """All training tokens as one flat array (n_train_tokens,), read-only and memory-mapped
        (a `ShardedTokens` over the shards; a plain memmap for a pre-shard entry)."""
        return open_split(self.cache_dir, self.meta, "train", TRAIN_FILE)

    def val_tokens(self):
        """All validation tokens, like `train_tokens`."""
        return open_split(self.cache_dir, self.meta, "val", VAL_FILE)

    def batcher(self, batch_size: int, seq_len: int, seed: int, rank: int = 0, world_size: int = 1):
        """The training batches (`TokenBatcher`), as `PreparedChat.batcher` gives chat rows."""
        from moe.data.loader import TokenBatcher  # lazy: the loader imports torch (module docstring of moe.data)
        return TokenBatcher(self.train_tokens(), batch_size, seq_len, seed, rank, world_size)

    def eval_batches(self, batch_size: int, seq_len: int, n_batches: int) -> list:
        from moe.data.loader import eval_batches  # lazy: the loader imports torch (module docstring of moe.data)
        return eval_batches(self.val_tokens(), batch_size, seq_len, n_batches)

    @property
    def train_path(self) -> Path:
        """The training token file, when the split is a single shard."""
        return _only(self.train_paths, "train")

    @property
    def val_path(self) -> Path:
        return _only(self.val_paths, "val")


def _only(paths: list[Path], split: str) -> Path:
    if len(paths) != 1:
        raise ValueError(f"the {split} split is {len(paths)} shards; read it with {split}_tokens()")
    return paths[0]


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size < 2**16 else np.uint32)


def prepare_data(cfg: DataConfig, cache_root: Optional[str] = None,
                 tokenizer: Optional[Tokenizer] = None, require_prepared: bool = False) -> PreparedData:
    """Build (or load from the cache) the tokenised train/val splits of `cfg`'s corpus.

    `cache_root` overrides `cfg.cache_dir`. `tokenizer` tokenises with that tokenizer instead of
    the one `cfg` describes (a resumed run uses its checkpoint's). Concurrent callers with the
    same settings build the entry once: the others wait on a file lock, then load it.
    `require_prepared`: never build; a missing entry is a `ConfigError` saying how to prepare it
    (distributed ranks: one rank building for hours while the others wait times out the job).
    """
    if cfg.name == "chat":  # conversations are rendered in memory, not cached (moe/data/chat/prepare.py)
        return prepare_chat(cfg, tokenizer)
    root = cache_root_of(cfg, cache_root)
    settings = _cache_settings(cfg, tokenizer)
    key = cache.cache_key(settings)
    entry = root / key
    if require_prepared:
        meta = cache.read_meta(entry)
        if meta is None or not _entry_complete(entry, meta):
            raise ConfigError(
                f"data: the prepared data for these data.* settings is missing ({entry} is "
                f"{'incomplete' if entry.exists() else 'not there'}); distributed runs only read prepared data: "
                "run `python -m moe.data.prepare <the same data.* overrides>` once first (or the run on one process)")
        return _from_meta(entry, meta, cache_hit=True, given=tokenizer)
    with cache.entry_lock(entry):
        meta = cache.read_meta(entry)
        if meta is not None and _entry_complete(entry, meta):
            try:
                prepared = _from_meta(entry, meta, cache_hit=True, given=tokenizer)
            except Exception as e:  # e.g. a damaged tokenizer.json (tokenizers raises bare Exception)
                logger.warning("data: cache entry %s is unreadable (%s); rebuilding it", entry, e)
            else:
                logger.info("data: cache hit %s (%d train / %d val tokens)", entry,
                            meta["n_train_tokens"], meta["n_val_tokens"])
                return prepared
        elif entry.exists():
            logger.warning("data: cache entry %s is incomplete; rebuilding it", entry)
        meta = _build(cfg, entry, root, settings, key, tokenizer)
        return _from_meta(entry, meta, cache_hit=False, given=tokenizer)


def cache_root_of(cfg: DataConfig, cache_root: Optional[str] = None) -> Path:
    """The cache directory, with a warning when it is under the home directory (home file systems
    are often small and quota'd; a 10B-token corpus is ~20 GB of token files plus the source copy)."""
    root = Path(os.path.expanduser(str(cache_root if cache_root is not None else cfg.cache_dir))).resolve()
    home = Path(os.path.expanduser("~")).resolve()
    if root == home or home in root.parents:
        logger.warning("data: the data cache %s is under the home directory; for large corpora point "
                       "data.cache_dir (or $MOE_LAB_CACHE) at a scratch or project file system", root)
    return root


def resolve_num_proc(num_proc: Optional[int]) -> int:
    """`data.num_proc`, or (None) the CPU cores this process may use."""
    if num_proc is not None:
        return int(num_proc)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


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
    settings = {"source": source_identity(cfg), "tokenizer": tokenizer, "val_fraction": cfg.val_fraction,
                "max_chars": cfg.max_chars, "split_seed": SPLIT_SEED}
    if cfg.streaming:  # a different tokenizer sample (streaming.py); absent otherwise, so older keys still hit
        settings["streaming"] = True
    return settings


def _entry_complete(entry: Path, meta: dict) -> bool:
    """meta.json exists (written last) and every file it describes has the right size."""
    try:
        return (meta.get("cache_version") == cache.CACHE_VERSION
                and shards_complete(entry, meta, "train", TRAIN_FILE, meta["n_train_tokens"])
                and shards_complete(entry, meta, "val", VAL_FILE, meta["n_val_tokens"])
                and (entry / TOKENIZER_DIR / TOKENIZER_FILE).is_file())
    except (KeyError, TypeError, ValueError, OSError):
        return False


def _from_meta(entry: Path, meta: dict, cache_hit: bool, given: Optional[Tokenizer] = None) -> PreparedData:
    tok_dir = entry / TOKENIZER_DIR
    # A given tokenizer (it is what the entry was keyed on) may be a foreign HF one that Tokenizer.load refuses.
    tokenizer = given if given is not None else Tokenizer.load(tok_dir)
    shards = meta.get("shards") or {}
    paths = {split: [entry / name for name, _ in shards[split]] if split in shards else [entry / legacy]
             for split, legacy in (("train", TRAIN_FILE), ("val", VAL_FILE))}
    return PreparedData(train_paths=paths["train"], val_paths=paths["val"], tokenizer=tokenizer,
                        tokenizer_dir=tok_dir, vocab_size=tokenizer.vocab_size,
                        n_train_tokens=int(meta["n_train_tokens"]), n_val_tokens=int(meta["n_val_tokens"]),
                        cache_dir=entry, cache_hit=cache_hit, dtype=meta["dtype"], meta=meta)


# --------------------------------------------------------------------------- build


def _build(cfg: DataConfig, entry: Path, root: Path, settings: dict, key: str,
           given: Optional[Tokenizer] = None) -> dict:
    t0 = time.perf_counter()
    cache.reset_entry(entry)
    writers: dict[str, ShardWriter] = {}

    def open_writers(tokenizer: Tokenizer) -> np.dtype:
        tokenizer.save(entry / TOKENIZER_DIR)
        dtype = token_dtype(tokenizer.vocab_size)
        writers.update({s: ShardWriter(entry, s, dtype, cfg.shard_tokens) for s in ("train", "val")})
        logger.info("data: tokenizer ready, %d tokens (%.1fs)", tokenizer.vocab_size, time.perf_counter() - t0)
        return dtype

    try:
        if cfg.streaming:
            tokenizer = streaming.streaming_tokenizer(cfg, given, lambda texts: _train_bpe(cfg, texts))
            dtype = open_writers(tokenizer)
            n_docs = streaming.tokenize_stream(cfg, tokenizer, writers)
        else:
            tokenizer, dtype, n_docs = _build_in_memory(cfg, root, given, open_writers, writers, entry)
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    shards = {split: w.finish() for split, w in writers.items()}
    counts = {split: sum(n for _, n in files) for split, files in shards.items()}
    meta = {
        "cache_version": cache.CACHE_VERSION,
        "key": key,
        "settings": settings,
        "dtype": dtype.name,
        "vocab_size": tokenizer.vocab_size,
        "n_train_tokens": counts["train"],
        "n_val_tokens": counts["val"],
        "shards": shards,
        "n_train_docs": n_docs["train"],
        "n_val_docs": n_docs["val"],
        "build_seconds": round(time.perf_counter() - t0, 3),
    }
    cache.write_json_atomic(entry / cache.META_FILE, meta)  # last: marks the entry complete
    logger.info("data: prepared %s in %.1fs: %d train / %d val tokens in %d + %d shard(s)", entry,
                meta["build_seconds"], counts["train"], counts["val"], len(shards["train"]), len(shards["val"]))
    return meta


def _build_in_memory(cfg: DataConfig, root: Path, given: Optional[Tokenizer], open_writers, writers: dict,
                     entry: Path):
    """The corpus as a `datasets.Dataset` (an Arrow copy on disk), tokenised with `Dataset.map`."""
    t0 = time.perf_counter()
    ds = load_source(cfg, hf_cache_dir=str(root / "hf_datasets"))
    train_ds, val_ds = _split(ds, cfg.val_fraction)
    logger.info("data: %d documents -> %d train / %d val (%.1fs)", len(ds), len(train_ds), len(val_ds),
                time.perf_counter() - t0)
    tokenizer = given if given is not None else _get_tokenizer(cfg, train_ds)
    dtype = open_writers(tokenizer)
    for split, split_ds in (("train", train_ds), ("val", val_ds)):
        t = time.perf_counter()
        _tokenize_into(split_ds, tokenizer, dtype, writers[split], resolve_num_proc(cfg.num_proc),
                       scratch=entry / f"ids-{split}.arrow")
        logger.info("data: %s split tokenised (%.1fs)", split, time.perf_counter() - t)
    return tokenizer, dtype, {"train": len(train_ds), "val": len(val_ds)}


def _split(ds: datasets.Dataset, val_fraction: float) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Train / val Datasets, split by document (one document: its head / its tail)."""
    import datasets  # here, not at the top: see TYPE_CHECKING above
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

    return _train_bpe(cfg, texts())


def _train_bpe(cfg: DataConfig, texts) -> Tokenizer:
    return Tokenizer.train(texts, cfg.vocab_size, max_chars=cfg.tokenizer_train_chars,
                           min_frequency=BPE_MIN_FREQUENCY)


def _encode_batch(batch: dict, tokenizer, eos_id: int) -> dict:
    """Dataset.map worker: token ids of each document, followed by <|eos|>."""
    encodings = tokenizer.encode_batch_fast([t or "" for t in batch["text"]], add_special_tokens=False)
    return {"ids": [e.ids + [eos_id] for e in encodings]}


def _tokenize_into(ds: datasets.Dataset, tokenizer: Tokenizer, dtype: np.dtype, writer: ShardWriter,
                   num_proc: int, scratch: Path) -> None:
    """Tokenise `ds` and write all its tokens back to back into `writer`'s shards."""
    import datasets  # here, not at the top: see TYPE_CHECKING above
    import pyarrow.compute as pc
    n_proc = num_proc if num_proc > 1 and len(ds) >= num_proc * MIN_ROWS_PER_PROC else 1
    features = datasets.Features({"ids": datasets.List(datasets.Value(dtype.name))})
    with _tokenizers_parallelism_off(n_proc > 1):
        ids_ds = ds.map(
            _encode_batch, batched=True, batch_size=MAP_BATCH_SIZE, num_proc=n_proc,
            remove_columns=ds.column_names, features=features,
            fn_kwargs={"tokenizer": tokenizer.backend, "eos_id": tokenizer.eos_id},
            # Our own cache is the source of truth; the Arrow output is scratch in the entry.
            load_from_cache_file=False, cache_file_name=str(scratch),
            desc=f"tokenising {writer.split}",
        )
    try:
        for table in ids_ds.with_format("arrow").iter(batch_size=4096):
            # Flatten list<uint> rows into one array; zero-copy when there are no nulls.
            writer.write(pc.list_flatten(table["ids"]).to_numpy(zero_copy_only=False).astype(dtype, copy=False))
    finally:
        del ids_ds
        for p in scratch.parent.glob(f"{scratch.stem}*.arrow"):  # the shards of a multi-process map
            p.unlink(missing_ok=True)


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
