"""Chat rows in: each row becomes one conversation, a list of {"role", "content"} messages.

Two row shapes are read (a row may hold either):

- OpenAI `messages`: [{"role": "system" | "user" | "assistant", "content": "..."}, ...]
- ShareGPT `conversations`: [{"from": "system" | "human" | "gpt", "value": "..."}, ...]
  (`from` values map to roles through `SHAREGPT_ROLES`)

Anything else is one `ConfigError` naming the file, the row and what was expected: a chat set
of the wrong shape should stop a run before tokenisation, not train on garbage.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from moe.config import DataConfig
from moe.data.sources import resolve_paths  # (sources imports `datasets` only where it loads data)
from moe.errors import ConfigError

SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}
ROLES = ("system", "user", "assistant")
CHAT_EXTENSIONS = (".jsonl", ".json", ".parquet")
EXPECTED = ("expected a 'messages' list of {role, content} (OpenAI) or a 'conversations' list of "
            "{from, value} (ShareGPT)")

Conversation = list[dict[str, str]]


def normalise_row(row: Any, where: str) -> Conversation:
    """One row -> a conversation of {"role", "content"}; a ConfigError naming `where` otherwise."""
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: a chat row must be an object; got {type(row).__name__}; {EXPECTED}")
    if row.get("messages") is not None:
        return [_message(m, where, i, "role", "content", {r: r for r in ROLES})
                for i, m in enumerate(_turns(row["messages"], where, "messages"))]
    if row.get("conversations") is not None:
        return [_message(m, where, i, "from", "value", SHAREGPT_ROLES)
                for i, m in enumerate(_turns(row["conversations"], where, "conversations"))]
    raise ConfigError(f"{where}: the row has keys {sorted(row)}; {EXPECTED}")


def _turns(turns: Any, where: str, key: str) -> list:
    if not isinstance(turns, (list, tuple)) or not turns:
        raise ConfigError(f"{where}: '{key}' must be a non-empty list; got {turns!r:.80}")
    return list(turns)


def _message(m: Any, where: str, i: int, role_key: str, text_key: str, roles: dict) -> dict[str, str]:
    if not isinstance(m, dict) or role_key not in m or text_key not in m:
        raise ConfigError(f"{where}: turn {i} must be an object with '{role_key}' and '{text_key}'; got {m!r:.80}")
    role, text = m[role_key], m[text_key]
    if role not in roles:
        raise ConfigError(f"{where}: turn {i} has {role_key}={role!r}; allowed: {sorted(roles)}")
    if not isinstance(text, str):
        raise ConfigError(f"{where}: turn {i} '{text_key}' must be a string; got {type(text).__name__}")
    return {"role": roles[role], "content": text}


# --------------------------------------------------------------------------- sources


def read_jsonl(path: Path) -> Iterable[tuple[Any, str]]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line), f"{path}:{n}"
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{n}: not valid JSON ({e.msg})") from None


def read_json(path: Path) -> Iterable[tuple[Any, str]]:
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e.msg}); a .json chat file is a list of rows") from None
    if not isinstance(rows, list):
        raise ConfigError(f"{path}: a .json chat file must hold a list of rows; got {type(rows).__name__}")
    return ((row, f"{path} row {i}") for i, row in enumerate(rows))


def read_parquet(path: Path) -> Iterable[tuple[Any, str]]:
    import pyarrow.parquet as pq  # lazy: only parquet chat files need it

    return ((row, f"{path} row {i}") for i, row in enumerate(pq.read_table(path).to_pylist()))


def read_hub(cfg: DataConfig) -> Iterable[tuple[Any, str]]:
    """A Hub dataset split; `data.hub_name` may also be a local dataset directory (the tests' route)."""
    import datasets  # lazy: a heavy import the local-file route does not need

    try:
        ds = datasets.load_dataset(os.path.expanduser(cfg.hub_name), cfg.hub_config, split=cfg.hub_split)
    except Exception as e:  # noqa: BLE001 - datasets raises many kinds for a bad name / split
        raise ConfigError(f"data.hub_name={cfg.hub_name!r}: could not load split {cfg.hub_split!r}: "
                          f"{type(e).__name__}: {e}") from None
    return ((row, f"{cfg.hub_name} row {i}") for i, row in enumerate(ds))


def chat_files(path: Any) -> list[Path]:
    """`data.path` for data=chat: the files (a file, a glob or a list), each .jsonl / .json / .parquet."""
    files = resolve_paths(path)
    for f in files:
        if f.suffix.lower() not in CHAT_EXTENSIONS:
            raise ConfigError(f"data.path: {str(f)!r} is not a chat file; allowed extensions: {list(CHAT_EXTENSIONS)}")
    return files


def load_conversations(cfg: DataConfig) -> list[Conversation]:
    """Every row of the configured chat source as a conversation, in order."""
    if cfg.name != "chat":
        raise ConfigError(f"data.name={cfg.name!r}: chat rows need data=chat")
    if cfg.path:
        readers = {".jsonl": read_jsonl, ".json": read_json, ".parquet": read_parquet}
        raw = (pair for f in chat_files(cfg.path) for pair in readers[f.suffix.lower()](f))
    elif cfg.hub_name:
        raw = read_hub(cfg)
    else:
        raise ConfigError("data=chat needs data.path (.jsonl / .json / .parquet files) or data.hub_name")
    return [normalise_row(row, where) for row, where in raw]
