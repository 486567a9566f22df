"""A transformers tokenizer behind the interface of `moe.data.Tokenizer` (`HFTokenizer`).

It lives with the data layer because chat data (`data=chat`) renders conversations with any
model's tokenizer; `moe/hf/io.py` re-exports it for the loaders and the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from transformers import AutoTokenizer


class HFTokenizer:
    """A transformers tokenizer behind the `moe.data.Tokenizer` interface (encode without
    special tokens unless `add_bos`, decode, the chat template, special ids)."""

    def __init__(self, tok):
        self.tok = tok

    @classmethod
    def load(cls, path: Any) -> "HFTokenizer":
        return cls(AutoTokenizer.from_pretrained(str(path)))

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(self.tok.encode(text, add_special_tokens=False))
        return [self.bos_id, *ids] if add_bos and self.bos_id is not None else ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        if not getattr(self.tok, "chat_template", None):
            raise ValueError("this tokenizer has no chat template")
        return self.tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)

    def save(self, directory: Any) -> Path:
        self.tok.save_pretrained(str(directory))
        return Path(directory)

    @property
    def vocab_size(self) -> int:
        return len(self.tok)

    @property
    def backend(self):
        """The fast tokenizer's `tokenizers.Tokenizer` (what the data pipeline tokenises corpora with)."""
        return self.tok.backend_tokenizer

    @property
    def pad_id(self) -> Optional[int]:
        return self.tok.pad_token_id

    @property
    def bos_id(self) -> Optional[int]:
        return self.tok.bos_token_id

    @property
    def eos_id(self) -> Optional[int]:
        return self.tok.eos_token_id

    @property
    def special_ids(self) -> dict[str, int]:
        return {t: self.tok.convert_tokens_to_ids(t) for t in self.tok.all_special_tokens}

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"HFTokenizer({type(self.tok).__name__}, vocab_size={self.vocab_size})"
