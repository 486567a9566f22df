"""`prepare_chat`: a chat set -> rendered train / val conversations -> batchers for a seq_len.

What `prepare_data` returns for `data=chat` (`PreparedChat`): the tokenizer, the token counts
and `batcher` / `eval_batches`, the same two calls the trainer makes for text data. The
conversations are rendered once, in memory (chat sets are small next to pretraining corpora;
each distributed rank renders its own copy, deterministically); rows of `train.seq_len`
tokens are built when a batcher is asked for, since packing depends on the length.

The tokenizer: the one given (a resumed run's, a fine-tuned model's), else `data.tokenizer_path`
(a moe-lab tokenizer, or any transformers tokenizer with a chat template), else a byte-level
BPE trained on the training conversations' text (rendered with the project's template).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from moe.config import DataConfig
from moe.data.chat.batcher import ChatBatcher, chat_eval_batches
from moe.data.chat.packing import ChatRows, Example, build_rows
from moe.data.chat.render import check_chat_template, render_conversation
from moe.data.chat.rows import load_conversations
from moe.data.split import split_indices
from moe.data.tokenizer import Tokenizer
from moe.errors import ConfigError

logger = logging.getLogger(__name__)

Rendered = tuple[list[int], list[bool]]  # (ids, assistant mask) of one conversation


@dataclass
class PreparedChat:
    tokenizer: Any
    train: list[Rendered]
    val: list[Rendered]
    packing: bool
    skipped_no_assistant: int = 0
    stats: dict = field(default_factory=dict)  # per split and seq_len: rows, cut conversations

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def n_train_tokens(self) -> int:
        return sum(len(ids) for ids, _ in self.train)

    @property
    def n_val_tokens(self) -> int:
        return sum(len(ids) for ids, _ in self.val)

    def rows(self, split: str, seq_len: int) -> ChatRows:
        """The split's conversations as rows of seq_len tokens; conversations cut by seq_len are
        counted and warned about (dropped when the cut leaves no assistant token)."""
        examples, cut, dropped = [], 0, 0
        for ids, mask in (self.train if split == "train" else self.val):
            ex = Example.from_mask(ids, mask, seq_len)
            cut += len(ids) > seq_len
            if ex.n_loss_tokens == 0:
                dropped += 1
                continue
            examples.append(ex)
        if cut:
            logger.warning("chat %s: %d conversation(s) longer than train.seq_len=%d were cut (%d of them dropped: "
                           "no assistant token left)", split, cut, seq_len, dropped)
        if not examples:
            raise ConfigError(f"data=chat: no {split} conversation has an assistant token within "
                              f"train.seq_len={seq_len}; raise train.seq_len")
        pad_id = self.tokenizer.pad_id if self.tokenizer.pad_id is not None else self.tokenizer.eos_id
        rows = build_rows(examples, seq_len, int(pad_id or 0), self.packing)
        self.stats[f"{split}@{seq_len}"] = {"rows": len(rows), "conversations": len(examples), "cut": cut,
                                            "dropped": dropped}
        return rows

    def batcher(self, batch_size: int, seq_len: int, seed: int, rank: int = 0, world_size: int = 1) -> ChatBatcher:
        return ChatBatcher(self.rows("train", seq_len), batch_size, seed, rank, world_size)

    def eval_batches(self, batch_size: int, seq_len: int, n_batches: int) -> list[tuple]:
        return chat_eval_batches(self.rows("val", seq_len), batch_size, n_batches)


def load_chat_tokenizer(path: str):
    """A moe-lab tokenizer when `path` holds one, else the transformers tokenizer there."""
    from moe.data.hf_tokenizer import HFTokenizer  # lazy: transformers is a heavy import

    try:
        return Tokenizer.load(path)
    except (ValueError, FileNotFoundError):  # someone else's tokenizer (not our special tokens) or no tokenizer.json
        pass
    try:
        return HFTokenizer.load(Path(path).expanduser())
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds
        raise ConfigError(f"data.tokenizer_path={path!r}: no tokenizer could be loaded ({type(e).__name__}: {e})") \
            from None


def prepare_chat(cfg: DataConfig, tokenizer: Any = None) -> PreparedChat:
    conversations = load_conversations(cfg)
    train_idx, val_idx = split_indices(len(conversations), cfg.val_fraction)
    if tokenizer is None and cfg.tokenizer_path:
        tokenizer = load_chat_tokenizer(cfg.tokenizer_path)
    if tokenizer is None:
        texts = (m["content"] for i in train_idx for m in conversations[i])
        tokenizer = Tokenizer.train(texts, cfg.vocab_size, max_chars=cfg.tokenizer_train_chars)
    check_chat_template(tokenizer, repr(cfg.tokenizer_path or type(tokenizer).__name__))
    splits, skipped = [], 0
    for idx in (train_idx, val_idx):
        rendered = []
        for i in idx:
            if not any(m["role"] == "assistant" for m in conversations[i]):
                skipped += 1
                continue
            rendered.append(render_conversation(tokenizer, conversations[i]))
        splits.append(rendered)
    if skipped:
        logger.warning("chat: %d of %d conversation(s) have no assistant turn and were skipped", skipped,
                       len(conversations))
    if not splits[0] or not splits[1]:
        raise ConfigError(f"data=chat: the {'train' if not splits[0] else 'validation'} split has no conversation "
                          f"with an assistant turn ({len(conversations)} rows, {skipped} without one)")
    logger.info("chat: %d train / %d val conversations, %s packing", len(splits[0]), len(splits[1]),
                "with" if cfg.packing else "without")
    return PreparedChat(tokenizer, splits[0], splits[1], bool(cfg.packing), skipped)

