"""Chat rows in: OpenAI `messages`, ShareGPT `conversations`, from JSONL, parquet and hub-style
datasets; a row of the wrong shape is one clear error naming where it is."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moe.config import DataConfig
from moe.data.chat.rows import load_conversations, normalise_row
from moe.errors import ConfigError


def test_the_fixture_set_loads_in_both_shapes(chat_dir):
    openai = load_conversations(DataConfig(name="chat", path=str(chat_dir / "messages.jsonl")))
    share = load_conversations(DataConfig(name="chat", path=str(chat_dir / "sharegpt.jsonl")))
    assert len(openai) == 32 and len(share) == 8
    assert share[0] == [{"role": "user", "content": "How many legs do 2 birds have?"},
                        {"role": "assistant", "content": "2 birds have 4 legs."}]


def test_parquet_and_a_local_dataset_directory_give_the_same_rows(chat_dir, tmp_path):
    rows = [json.loads(line) for line in (chat_dir / "messages.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "chat.parquet")
    from_parquet = load_conversations(DataConfig(name="chat", path=str(tmp_path / "chat.parquet")))
    hub_dir = tmp_path / "hubset"
    hub_dir.mkdir()
    (hub_dir / "train.jsonl").write_text((chat_dir / "messages.jsonl").read_text())
    from_hub = load_conversations(DataConfig(name="chat", hub_name=str(hub_dir), hub_split="train"))
    expected = load_conversations(DataConfig(name="chat", path=str(chat_dir / "messages.jsonl")))
    assert from_parquet == expected and from_hub == expected


@pytest.mark.parametrize("row, message", [
    ({"text": "hello"}, r"the row has keys \['text'\]; expected a 'messages' list"),
    ({"messages": "hi"}, "'messages' must be a non-empty list"),
    ({"messages": [{"role": "user"}]}, "turn 0 must be an object with 'role' and 'content'"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "turn 0 has role='robot'; allowed"),
    ({"conversations": [{"from": "human", "value": 3}]}, "turn 0 'value' must be a string"),
    (["user", "hi"], "a chat row must be an object"),
])
def test_a_row_of_the_wrong_shape_is_one_clear_error(row, message):
    with pytest.raises(ConfigError, match=message):
        normalise_row(row, "chat.jsonl:3")


def test_the_error_names_the_file_and_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"prompt": "x"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: the row has keys \['prompt'\]"):
        load_conversations(DataConfig(name="chat", path=str(f)))


def test_a_text_file_is_not_a_chat_file(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    with pytest.raises(ConfigError, match="is not a chat file; allowed extensions"):
        load_conversations(DataConfig(name="chat", path=str(f)))
