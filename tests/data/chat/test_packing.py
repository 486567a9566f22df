"""Packed rows (document mask, positions restarting) and padded rows give each conversation the
same loss; packing never lets a conversation see or predict another."""

import pytest
import torch
import torch.nn.functional as F

from moe.config import ModelConfig
from moe.config.schema import AttentionConfig
from moe.data.chat.packing import Example, forward_inputs, pack_rows, pad_rows
from moe.data.chat.render import IGNORE_INDEX, render_conversation
from moe.data.chat.rows import load_conversations
from moe.config import DataConfig
from moe.model import Transformer


def _examples(chat_dir, tokenizer, n=8, seq_len=96):
    convs = load_conversations(DataConfig(name="chat", path=str(chat_dir / "messages.jsonl")))[:n]
    return [Example.from_mask(*render_conversation(tokenizer, c), seq_len) for c in convs]


def test_packing_layout_segments_positions_and_no_target_across_a_boundary(chat_dir, chat_tokenizer):
    examples = _examples(chat_dir, chat_tokenizer)
    rows = pack_rows(examples, 96, pad_id=0)
    assert len(rows) < len(examples)  # several conversations share a row
    flat = [(r, s) for r in range(len(rows)) for s in rows.segments_NT[r].unique().tolist()]
    n_conv = 0
    for r, s in flat:
        where = (rows.segments_NT[r] == s).nonzero().flatten()
        assert torch.equal(rows.positions_NT[r, where], torch.arange(len(where)))  # positions restart at 0
        if rows.targets_NT[r, where].ne(IGNORE_INDEX).any():
            ex = examples[n_conv]
            n_conv += 1
            assert rows.input_ids_NT[r, where].tolist() == ex.ids and rows.targets_NT[r, where].tolist() == ex.targets
            assert rows.targets_NT[r, where[-1]] == IGNORE_INDEX  # the last token predicts nothing
    assert n_conv == len(examples)


def _per_conversation_loss(model, rows, n_examples):
    """Summed cross-entropy of each conversation, in order (conversations are contiguous)."""
    x, y, *extra = rows.batch(torch.arange(len(rows)).numpy())
    logits = model(x, **forward_inputs(extra)).logits
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE_INDEX,
                          reduction="none").view(y.shape)
    segments = extra[1] if extra else torch.zeros_like(y)
    losses = []
    for r in range(len(rows)):
        for s in segments[r].unique().tolist():
            sel = segments[r] == s
            if y[r][sel].ne(IGNORE_INDEX).any():
                losses.append(nll[r][sel].sum())
    assert len(losses) == n_examples
    return torch.stack(losses)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_packed_and_padded_rows_give_the_same_per_conversation_loss(chat_dir, chat_tokenizer, attention):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=448, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=4,
                      expert_hidden=32, max_seq_len=96, attention=AttentionConfig(name=attention))
    model = Transformer(cfg).eval()
    examples = _examples(chat_dir, chat_tokenizer)
    with torch.no_grad():
        packed = _per_conversation_loss(model, pack_rows(examples, 96, pad_id=0), len(examples))
        padded = _per_conversation_loss(model, pad_rows(examples, 96, pad_id=0), len(examples))
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)
    assert packed.min() > 0
