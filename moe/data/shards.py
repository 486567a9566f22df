"""A split's tokens as several raw token files (shards) and the index that lists them.

    <entry>/train-00000.bin, train-00001.bin, ...   little-endian uint16/uint32, back to back
    meta.json: "shards": {"train": [["train-00000.bin", n_tokens], ...], "val": [...]}

One file per split stops working at scale: a 10B-token split is a 20 GB file that one writer
must produce in one go, that cannot be copied or checked in pieces, and whose loss means
rebuilding everything. Shards of `data.shard_tokens` tokens are written one after the other
(each to a temporary name, then moved into place) and read back as one flat token stream by
`ShardedTokens`: the concatenation of the shards is exactly the stream a single file held, so
batches do not depend on the shard size. Entries written before shards existed (`train.bin`,
`val.bin`, no "shards" in meta.json) are read as one shard.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np

from moe.data import cache


class ShardWriter:
    """Append tokens; a new shard file starts every `shard_tokens` tokens."""

    def __init__(self, entry: Path, split: str, dtype: np.dtype, shard_tokens: int):
        if shard_tokens <= 0:
            raise ValueError(f"shard_tokens={shard_tokens} must be > 0")
        self.entry, self.split, self.dtype, self.shard_tokens = entry, split, np.dtype(dtype), shard_tokens
        self.shards: list[list] = []  # [file name, n_tokens] of the finished shards
        self._f = None
        self._tmp: Optional[Path] = None
        self._n = 0  # tokens in the open shard

    def _open(self) -> None:
        name = f"{self.split}-{len(self.shards):05d}.bin"
        self._tmp = cache.temp_path_beside(self.entry / name)
        self._f = open(self._tmp, "wb")
        self.shards.append([name, 0])
        self._n = 0

    def _close(self) -> None:
        if self._f is None:
            return
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self._tmp, self.entry / self.shards[-1][0])
        self.shards[-1][1] = self._n
        self._f = self._tmp = None

    def write(self, tokens_N: np.ndarray) -> None:
        tokens_N = np.asarray(tokens_N).astype(self.dtype, copy=False)
        while tokens_N.size:
            if self._f is None:
                self._open()
            take = min(tokens_N.size, self.shard_tokens - self._n)
            self._f.write(tokens_N[:take].tobytes())
            self._n += take
            tokens_N = tokens_N[take:]
            if self._n == self.shard_tokens:
                self._close()

    def finish(self) -> list[list]:
        """Close the last shard; returns the index: [[file name, n_tokens], ...] (one empty shard
        for an empty split, so every split has a file)."""
        if self._f is None and not self.shards:
            self._open()
        self._close()
        return self.shards

    def abort(self) -> None:
        if self._f is not None:
            self._f.close()
            self._tmp.unlink(missing_ok=True)
            self._f = None


class ShardedTokens:
    """The shards of one split as one read-only flat token array (memory-mapped).

    Supports what the batcher and evaluation use: `len()`, and indexing with an integer array
    (any shape) or a slice; a window may span two shards."""

    def __init__(self, paths: list[Path], dtype):
        self.dtype = np.dtype(dtype)
        self.maps = [np.memmap(p, dtype=self.dtype, mode="r") if os.path.getsize(p) else
                     np.empty(0, dtype=self.dtype) for p in paths]
        sizes = np.array([len(m) for m in self.maps], dtype=np.int64)
        self.ends = np.cumsum(sizes)  # ends[i]: global index one past shard i
        self.starts = self.ends - sizes

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __array__(self, dtype=None, copy=None):
        out = np.concatenate(self.maps) if self.maps else np.empty(0, self.dtype)
        return out.astype(dtype, copy=False) if dtype is not None else out

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return self[np.arange(len(self), dtype=np.int64)[idx]]
        idx = np.asarray(idx, dtype=np.int64)
        flat = idx.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"token index out of range [0, {len(self)})")
        shard = np.searchsorted(self.ends, flat, side="right")
        out = np.empty(flat.shape, dtype=self.dtype)
        for s in np.unique(shard):
            sel = shard == s
            out[sel] = self.maps[s][flat[sel] - self.starts[s]]
        return out.reshape(idx.shape)


def open_split(entry: Path, meta: dict, split: str, legacy_file: str):
    """The split's tokens: a `ShardedTokens` over the index's shards, or the memmap of a single
    shard or of a pre-shard entry's single file."""
    dtype = np.dtype(meta["dtype"])
    shards = (meta.get("shards") or {}).get(split)
    if shards is None:
        return np.memmap(entry / legacy_file, dtype=dtype, mode="r")
    if len(shards) == 1 and shards[0][1] > 0:  # one file: the plain memmap, every numpy operation works
        return np.memmap(entry / shards[0][0], dtype=dtype, mode="r")
    return ShardedTokens([entry / name for name, _ in shards], dtype)


def shards_complete(entry: Path, meta: dict, split: str, legacy_file: str, n_tokens: int) -> bool:
    """Every file the index lists exists with its size, and they add up to `n_tokens`."""
    itemsize = np.dtype(meta["dtype"]).itemsize
    shards = (meta.get("shards") or {}).get(split)
    if shards is None:
        return (entry / legacy_file).stat().st_size == n_tokens * itemsize
    return (sum(int(n) for _, n in shards) == n_tokens
            and all((entry / name).stat().st_size == int(n) * itemsize for name, n in shards))
