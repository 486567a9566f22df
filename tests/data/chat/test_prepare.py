"""`prepare_data` for data=chat: splits, the counted skips and cuts, the batchers."""

import json
import logging

import pytest
import torch

from moe.config import DataConfig
from moe.data import prepare_data
from moe.errors import ConfigError


def _write(tmp_path, rows):
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def test_rows_without_an_assistant_turn_and_cut_rows_are_counted_and_warned(chat_dir, chat_tokenizer, tmp_path,
                                                                          caplog):
    rows = [json.loads(line) for line in (chat_dir / "messages.jsonl").read_text().splitlines()]
    rows += [{"messages": [{"role": "user", "content": "Nobody answers this."}]}] * 3
    rows += [{"messages": [{"role": "user", "content": "long " * 200}, {"role": "assistant", "content": "ok"}]}]
    cfg = DataConfig(name="chat", path=str(_write(tmp_path, rows)), val_fraction=0.2)
    with caplog.at_level(logging.WARNING):
        prep = prepare_data(cfg, tokenizer=chat_tokenizer)
        prep.rows("train", 64), prep.rows("val", 64)
    assert prep.skipped_no_assistant == 3
    assert "3 of 36 conversation(s) have no assistant turn" in caplog.text
    cut = sum(s["cut"] for s in prep.stats.values())
    dropped = sum(s["dropped"] for s in prep.stats.values())
    assert cut >= 1 and dropped == 1  # the long prompt leaves no assistant token within 64
    assert "longer than train.seq_len=64 were cut" in caplog.text


def test_the_batcher_is_deterministic_and_resumes(chat_dir, chat_tokenizer):
    prep = prepare_data(DataConfig(name="chat", path=str(chat_dir / "messages.jsonl"), val_fraction=0.2),
                        tokenizer=chat_tokenizer)
    a = prep.batcher(2, 64, seed=1)
    first = [a.next_batch() for _ in range(3)]
    assert len(first[0]) == 4 and first[0][0].shape == (2, 64)  # packed: x, y, positions, segments
    b = prep.batcher(2, 64, seed=1)
    b.next_batch()
    b_state = b.state_dict()
    c = prep.batcher(2, 64, seed=1)
    c.load_state_dict(b_state)
    assert all(torch.equal(u, v) for u, v in zip(c.next_batch(), first[1]))
    val = prep.eval_batches(2, 64, n_batches=2)
    assert val and all(len(batch) == 4 for batch in val)


def test_padding_gives_one_conversation_per_row(chat_dir, chat_tokenizer):
    cfg = DataConfig(name="chat", path=str(chat_dir / "messages.jsonl"), val_fraction=0.2, packing=False)
    prep = prepare_data(cfg, tokenizer=chat_tokenizer)
    rows = prep.rows("train", 96)
    assert len(rows) == len(prep.train) and rows.segments_NT is None
    assert len(prep.batcher(2, 96, seed=0).next_batch()) == 2  # padded: x, y


def test_a_set_with_no_assistant_turn_at_all_is_an_error(tmp_path, chat_tokenizer):
    rows = [{"messages": [{"role": "user", "content": f"question {i}"}]} for i in range(10)]
    with pytest.raises(ConfigError, match="has no conversation with an assistant turn"):
        prepare_data(DataConfig(name="chat", path=str(_write(tmp_path, rows))), tokenizer=chat_tokenizer)
