"""Data: raw text -> byte-level BPE tokens in memory-mapped files -> training batches.

    prep = prepare_data(cfg.data)                 # cached under data.cache_dir (or: python -m moe.data.prepare)
    batcher = TokenBatcher(prep.train_tokens(), batch_size, seq_len, seed, rank, world_size)
    x_BT, y_BT = batcher.next_batch()
    val = eval_batches(prep.val_tokens(), batch_size, seq_len, n_batches)

Names are imported on first use, so `from moe.data import Tokenizer` does not pay for
importing `datasets` (pipeline) or `torch` (loader).
"""

from moe.lazy_exports import lazy_exports

_EXPORTS = {
    "prepare_data": "moe.data.pipeline",
    "PreparedData": "moe.data.pipeline",
    "Tokenizer": "moe.data.tokenizer",
    "CHAT_TEMPLATE": "moe.data.tokenizer",
    "SPECIAL_TOKENS": "moe.data.tokenizer",
    "TokenBatcher": "moe.data.loader",
    "eval_batches": "moe.data.loader",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
