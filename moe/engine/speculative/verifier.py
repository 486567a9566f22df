"""What verification leaves of a drafted sequence: its rollback to the verified tokens, and the
logprobs of the tokens it emits (`SpecDecoder.verify_drafts` returns them as `NewTokens`).

Rollback: the accepted proposals are kept long enough to register the full blocks of verified
tokens in the prefix cache (their K/V are right), then the sequence's tokens end at its last
verified one and `BlockManager.trim` releases the blocks that held nothing but rejected
proposals. The emitted tokens are then appended by the engine, one by one through its stop checks,
exactly as a plain decode token is.
"""

from __future__ import annotations

import torch

from moe.engine.memory.block_manager import BlockManager
from moe.engine.sequence import Sequence


def roll_back(seq: Sequence, num_accepted: int, num_emitted: int, block_manager: BlockManager) -> None:
    """Drop `seq`'s proposals after verification: `num_accepted` of them were accepted and
    `num_emitted` tokens (those plus the target's own) will be appended; the K/V of the accepted
    ones is kept (counted as computed), the blocks beyond what the emitted tokens fill released."""
    L = seq.num_tokens - seq.num_draft_tokens  # verified tokens; proposals are made when L - 1 are computed
    del seq.token_ids[L + num_accepted:]
    seq.num_draft_tokens, seq.draft_probs = 0, None
    seq.num_computed_tokens = L - 1 + num_emitted
    block_manager.cache_full_blocks(seq)  # hashes only verified tokens: the accepted proposals are
    del seq.token_ids[L:]  # ... appended again by the engine, with the target's own token
    block_manager.trim(seq, L + num_emitted)


def drop_proposals(seq: Sequence) -> None:
    """Remove `seq`'s proposals from its tokens (they were not scheduled, or not verified)."""
    if seq.num_draft_tokens:
        del seq.token_ids[seq.num_tokens - seq.num_draft_tokens:]
    seq.num_draft_tokens, seq.draft_probs = 0, None


def discard(seq: Sequence) -> None:
    """Drop `seq`'s proposals and count the K/V computed for them as not computed (a step whose
    logits cannot be verified)."""
    drop_proposals(seq)
    seq.num_computed_tokens = seq.num_tokens - 1


def logprob_dicts(logits_RV: torch.Tensor, toks: list[int], n_top: int) -> list[dict[int, float]]:
    """Per emitted token: the raw model logprobs of the top `n_top` tokens and of the token itself
    (as the sampler reports them)."""
    lp = torch.log_softmax(logits_RV[:len(toks)].float(), dim=-1)
    out = []
    for j, t in enumerate(toks):
        d = {}
        if n_top:
            v, i = lp[j].topk(min(n_top, lp.shape[-1]))
            d = {int(a): float(b) for a, b in zip(i.tolist(), v.tolist())}
        d[t] = float(lp[j, t])
        out.append(d)
    return out
