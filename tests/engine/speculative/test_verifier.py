"""The verifier's rollback of a drafted sequence (moe/engine/speculative/verifier.py): what the
engine then appends must land on exactly the verified tokens, computed K/V and blocks."""

from moe.engine.memory.block_manager import BlockManager, hash_block
from moe.engine.sampling.sampler import SamplingParams
from moe.engine.sequence import Sequence
from moe.engine.speculative.verifier import discard, drop_proposals, roll_back

BS = 4
PROMPT = list(range(9))
DRAFTS = [100, 101, 102, 103, 104]


def drafted_after_forward(bm: BlockManager) -> Sequence:
    """A 9-token sequence with 8 tokens computed, 5 proposals appended, and the step that fed the
    last verified token and all 5 proposals run (14 tokens computed, 4 blocks)."""
    seq = Sequence("r", None, PROMPT, SamplingParams(), arrival_time=0.0)
    bm.admit(seq, [])
    assert bm.allocate_slots(seq, len(PROMPT) - 1)
    seq.num_computed_tokens = len(PROMPT) - 1
    seq.token_ids.extend(DRAFTS)
    seq.num_draft_tokens = len(DRAFTS)
    assert bm.allocate_slots(seq, len(DRAFTS) + 1)
    seq.num_computed_tokens += len(DRAFTS) + 1
    return seq


def test_roll_back_keeps_the_verified_tokens_and_the_blocks_the_emitted_ones_fill():
    bm = BlockManager(num_blocks=8, block_size=BS)
    seq = drafted_after_forward(bm)
    assert len(seq.block_table) == 4
    roll_back(seq, num_accepted=2, num_emitted=3, block_manager=bm)  # 2 proposals accepted + 1 of the target's
    assert seq.token_ids == PROMPT and seq.num_draft_tokens == 0 and seq.draft_probs is None
    assert seq.num_computed_tokens == len(PROMPT) - 1 + 3  # the K/V of the accepted proposals is kept
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 8 - 3  # 12 tokens after the append: 3 blocks
    # only full blocks of verified tokens are hashed (tokens 0..7): never a rejected proposal
    h0 = hash_block(None, PROMPT[:4])
    assert seq.block_hashes == [h0, hash_block(h0, PROMPT[4:8])]


def test_roll_back_of_a_full_acceptance_hashes_the_accepted_proposals():
    bm = BlockManager(num_blocks=8, block_size=BS)
    seq = drafted_after_forward(bm)
    roll_back(seq, num_accepted=5, num_emitted=6, block_manager=bm)
    assert seq.token_ids == PROMPT and seq.num_computed_tokens == 14
    assert len(seq.block_table) == 4  # 15 tokens after the append
    h0 = hash_block(None, PROMPT[:4])
    h1 = hash_block(h0, PROMPT[4:8])
    assert seq.block_hashes == [h0, h1, hash_block(h1, [8, 100, 101, 102])]


def test_discard_and_drop_proposals():
    bm = BlockManager(num_blocks=8, block_size=BS)
    seq = drafted_after_forward(bm)
    discard(seq)  # non-finite logits: nothing verified, the proposals' K/V not counted as computed
    assert seq.token_ids == PROMPT and seq.num_computed_tokens == len(PROMPT) - 1 and seq.num_draft_tokens == 0
    seq.token_ids.extend(DRAFTS[:2])
    seq.num_draft_tokens = 2
    drop_proposals(seq)  # not scheduled: nothing was computed for them
    assert seq.token_ids == PROMPT and seq.num_computed_tokens == len(PROMPT) - 1 and seq.draft_probs is None
