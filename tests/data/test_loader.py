"""TokenBatcher (deterministic, resumable, sharded) and eval_batches."""

import numpy as np
import pytest
import torch

from moe.data import TokenBatcher, eval_batches

SEQ = 8


def _stream(n: int) -> np.ndarray:
    # Token value = its position (mod 65536), so every window reveals where it came from.
    return (np.arange(n) % 65_536).astype(np.uint16)


def _window_ids(x_BT: torch.Tensor) -> set[int]:
    """Which seq_len+1 windows a batch came from (the first token is the window start)."""
    return {int(v) // (SEQ + 1) for v in x_BT[:, 0]}


def test_batches_are_shifted_windows():
    tokens = _stream(10 * (SEQ + 1) + 3)
    x, y = TokenBatcher(tokens, batch_size=4, seq_len=SEQ, seed=0).next_batch()
    assert x.shape == y.shape == (4, SEQ) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y[:, -1], x[:, -1] + 1)
    assert all(int(v) % (SEQ + 1) == 0 for v in x[:, 0])  # windows start on a window boundary
    assert torch.equal(x, x[:, :1] + torch.arange(SEQ))  # contiguous tokens of the stream


def test_epoch_visits_each_window_once_and_reshuffles():
    tokens = _stream(12 * (SEQ + 1))  # 12 windows, batch 4 -> 3 batches per epoch
    b = TokenBatcher(tokens, batch_size=4, seq_len=SEQ, seed=3)
    epoch0 = [b.next_batch()[0] for _ in range(3)]
    epoch1 = [b.next_batch()[0] for _ in range(3)]
    assert set().union(*map(_window_ids, epoch0)) == set(range(12))
    assert set().union(*map(_window_ids, epoch1)) == set(range(12))
    assert not all(torch.equal(a, c) for a, c in zip(epoch0, epoch1))  # a new permutation
    assert b.state_dict() == {"epoch": 1, "batch_in_epoch": 3}
    # Same seed, same sequence; another seed, another one.
    assert torch.equal(TokenBatcher(tokens, 4, SEQ, seed=3).next_batch()[0], epoch0[0])
    assert not torch.equal(TokenBatcher(tokens, 4, SEQ, seed=4).next_batch()[0], epoch0[0])


def test_resume_matches_uninterrupted_run_across_epochs():
    tokens = _stream(14 * (SEQ + 1) + 5)  # 14 windows, batch 4 -> 3 batches per epoch (2 windows unused)
    straight = TokenBatcher(tokens, batch_size=4, seq_len=SEQ, seed=7)
    reference = [straight.next_batch() for _ in range(10)]

    first = TokenBatcher(tokens, batch_size=4, seq_len=SEQ, seed=7)
    for _ in range(5):
        first.next_batch()
    state = first.state_dict()
    assert state == {"epoch": 1, "batch_in_epoch": 2}

    resumed = TokenBatcher(tokens, batch_size=4, seq_len=SEQ, seed=7)
    resumed.load_state_dict(dict(state))
    for (x_ref, y_ref) in reference[5:]:  # batches 5..9 cross into epoch 3
        x, y = resumed.next_batch()
        assert torch.equal(x, x_ref) and torch.equal(y, y_ref)
    assert resumed.state_dict() == straight.state_dict()

    with pytest.raises(ValueError, match="batch_in_epoch"):
        resumed.load_state_dict({"epoch": 0, "batch_in_epoch": 99})


def test_ranks_get_disjoint_shares_of_the_global_batch():
    tokens = _stream(64 * (SEQ + 1))
    world = 4
    ranks = [TokenBatcher(tokens, batch_size=2, seq_len=SEQ, seed=1, rank=r, world_size=world) for r in range(world)]
    global_batcher = TokenBatcher(tokens, batch_size=2 * world, seq_len=SEQ, seed=1)
    for _ in range(10):  # 64 windows / 8 per step = 8 steps per epoch: crosses an epoch boundary
        shares = [_window_ids(rb.next_batch()[0]) for rb in ranks]
        assert all(len(s) == 2 for s in shares)
        union = set().union(*shares)
        assert len(union) == 2 * world  # pairwise disjoint
        # Together the ranks consume exactly what one process with the global batch would.
        assert union == _window_ids(global_batcher.next_batch()[0])
    with pytest.raises(ValueError, match="rank=4"):
        TokenBatcher(tokens, 2, SEQ, seed=1, rank=4, world_size=4)


def test_short_stream_error_says_how_many_tokens_are_needed():
    with pytest.raises(ValueError, match=r"has 50 tokens; one batch needs 72 "):
        TokenBatcher(_stream(50), batch_size=4, seq_len=SEQ, seed=0, world_size=2)


def test_works_on_a_memmap(tmp_path):
    path = tmp_path / "tokens.bin"
    _stream(20 * (SEQ + 1)).tofile(path)
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    x, y = TokenBatcher(tokens, batch_size=3, seq_len=SEQ, seed=0).next_batch()
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert eval_batches(tokens, 3, SEQ, 2)[0][0][0, 0] == 0


def test_eval_batches_are_fixed_leading_windows():
    tokens = _stream(20 * (SEQ + 1))
    batches = eval_batches(tokens, batch_size=4, seq_len=SEQ, n_batches=3)
    assert len(batches) == 3
    starts = [int(v) for x, _ in batches for v in x[:, 0]]
    assert starts == [w * (SEQ + 1) for w in range(12)]  # the first 12 windows, in order
    again = eval_batches(tokens, batch_size=4, seq_len=SEQ, n_batches=3)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches, again))
    for x, y in batches:
        assert torch.equal(y[:, :-1], x[:, 1:])


def test_eval_batches_on_short_splits():
    tokens = _stream(20 * (SEQ + 1))
    assert len(eval_batches(tokens, batch_size=4, seq_len=SEQ, n_batches=100)) == 5  # only 5 full batches fit
    (x, y), = eval_batches(_stream(3 * (SEQ + 1)), batch_size=4, seq_len=SEQ, n_batches=2)
    assert x.shape == (3, SEQ)  # one smaller batch rather than none
    with pytest.raises(ValueError, match=r"validation split has 5 tokens; one sequence needs seq_len \+ 1 = 9"):
        eval_batches(_stream(5), batch_size=4, seq_len=SEQ, n_batches=2)
