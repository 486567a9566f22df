"""Byte-level BPE tokenizer (a thin wrapper around `tokenizers.Tokenizer`) and the chat template.

Byte-level means every string, whatever its characters, is encoded losslessly: the base
vocabulary is the 256 bytes, so `decode(encode(s)) == s` for any unicode `s`. The special
tokens are reserved first, so they always have ids 0..6 (`SPECIAL_TOKENS` order), and are
matched whole before pre-tokenisation, so "<|end|>" in a text is one token, never split.

`save` writes `tokenizer.json` plus a `tokenizer_config.json` (chat template, special token
names) so that `transformers.PreTrainedTokenizerFast.from_pretrained(directory)` works too.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

logger = logging.getLogger(__name__)

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
# Order = ids: pad 0, bos 1, eos 2, then the chat markers.
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
CHAT_ROLES = ("system", "user", "assistant")

# `raise_exception` is the helper transformers provides to templates; we provide it too, so
# the same template renders (and rejects a bad role) identically in both places.
CHAT_TEMPLATE = (
    "<|bos|>"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('chat role must be one of system, user, assistant; got ' + message['role']|string) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


class Tokenizer:
    """Byte-level BPE with the reserved special tokens of `SPECIAL_TOKENS`."""

    def __init__(self, tokenizer: _HFTokenizer):
        self._check_special_tokens(tokenizer)
        self._tok = tokenizer

    # ------------------------------------------------------------------ construction

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, max_chars: Optional[int] = None,
              min_frequency: int = 2) -> "Tokenizer":
        """Train on `texts` (at most `max_chars` characters of them, the last text cut to fit).

        The result may have fewer than `vocab_size` tokens when the text has too few
        pairs seen `min_frequency` times to merge.
        """
        n_base = len(SPECIAL_TOKENS) + 256
        if vocab_size <= n_base:
            raise ValueError(f"vocab_size={vocab_size} must be > {n_base} "
                             f"({len(SPECIAL_TOKENS)} special tokens + 256 bytes)")
        tok = _HFTokenizer(models.BPE())
        # add_prefix_space=False: a leading space is part of the text, so round trips are exact.
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),  # trainer gives them ids 0..N-1 in order
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, even unseen
            show_progress=False,
        )
        tok.train_from_iterator(_capped_batches(texts, max_chars), trainer=trainer)
        logger.info("trained byte-level BPE: %d tokens (asked for %d)", tok.get_vocab_size(), vocab_size)
        return cls(tok)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Tokenizer":
        """Load from a directory holding `tokenizer.json`, or from the `tokenizer.json` itself."""
        path = Path(os.path.expanduser(str(path)))
        file = path / TOKENIZER_FILE if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer file at {str(file)!r}")
        return cls(_HFTokenizer.from_file(str(file)))

    def save(self, directory: str | os.PathLike) -> Path:
        """Write `tokenizer.json` and `tokenizer_config.json` into `directory`; return it."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(directory / TOKENIZER_FILE))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
            "additional_special_tokens": list(SPECIAL_TOKENS[3:]),
            "chat_template": CHAT_TEMPLATE,
            # The text is byte-level: transformers must not "clean up" spaces on decode.
            "clean_up_tokenization_spaces": False,
            "special_tokens": list(SPECIAL_TOKENS),
        }
        with open(directory / TOKENIZER_CONFIG_FILE, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)
        return directory

    @staticmethod
    def _check_special_tokens(tok: _HFTokenizer) -> None:
        wrong = [f"{t} (id {tok.token_to_id(t)}, expected {i})"
                 for i, t in enumerate(SPECIAL_TOKENS) if tok.token_to_id(t) != i]
        if wrong:
            raise ValueError("tokenizer lacks the reserved special tokens at ids "
                             f"0..{len(SPECIAL_TOKENS) - 1}: {', '.join(wrong)}")

    # ------------------------------------------------------------------ encode / decode

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_bos else ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # encode_batch_fast skips offset tracking, which we never use.
        return [e.ids for e in self._tok.encode_batch_fast(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        if hasattr(ids, "tolist"):  # torch tensor / numpy array
            ids = ids.tolist()
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """Render `messages` ([{"role", "content"}, ...]) with `CHAT_TEMPLATE`."""
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError(f"message {i} must be a dict with 'role' and 'content'; got {m!r}")
            if m["role"] not in CHAT_ROLES:
                raise ValueError(f"message {i}: role {m['role']!r} is not one of {list(CHAT_ROLES)}")
            if not isinstance(m["content"], str):
                raise ValueError(f"message {i}: content must be a str; got {type(m['content']).__name__}")
        return _compiled_template().render(messages=list(messages), add_generation_prompt=add_generation_prompt)

    # ------------------------------------------------------------------ properties

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        return SPECIAL_TOKENS.index(PAD)

    @property
    def bos_id(self) -> int:
        return SPECIAL_TOKENS.index(BOS)

    @property
    def eos_id(self) -> int:
        return SPECIAL_TOKENS.index(EOS)

    @property
    def special_ids(self) -> dict[str, int]:
        """Special token -> id, e.g. {"<|pad|>": 0, ...}."""
        return {t: i for i, t in enumerate(SPECIAL_TOKENS)}

    @property
    def backend(self) -> _HFTokenizer:
        """The underlying `tokenizers.Tokenizer` (picklable; used by `Dataset.map` workers)."""
        return self._tok

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size})"


def _capped_batches(texts: Iterable[str], max_chars: Optional[int], batch: int = 256) -> Iterator[list[str]]:
    """Batches of texts totalling at most `max_chars` characters (batches feed the Rust side faster)."""
    buf: list[str] = []
    total = 0
    for text in texts:
        if max_chars is not None and total + len(text) > max_chars:
            text = text[: max_chars - total]
        if text:
            buf.append(text)
            total += len(text)
        if len(buf) >= batch:
            yield buf
            buf = []
        if max_chars is not None and total >= max_chars:
            break
    if buf:
        yield buf


def _raise_exception(message: str):
    raise ValueError(message)


@functools.lru_cache(maxsize=1)
def _compiled_template():
    """The chat template compiled as transformers does (sandboxed, trim_blocks, lstrip_blocks)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(CHAT_TEMPLATE)
