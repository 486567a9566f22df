"""The one path every new token takes, plain or speculative: `append_token` records it and runs
the stop checks; `stream_event` is what the request's caller receives for the step.

The sampler yields one token per sequence and the speculative verifier the accepted proposals
plus one of the target's own (`moe.engine.sequence.NewTokens`); the engine feeds both through
`append_token` token by token, so a stop (eos, a stop token or string, the grammar's end,
max_tokens, max_model_len) ends a request at the same token whichever produced it.
"""

from __future__ import annotations

from typing import Optional

from moe.engine.outputs import StreamEvent
from moe.engine.sequence import Sequence


def append_token(seq: Sequence, token: int, logprobs, now: float, eos_id: Optional[int], tokenizer,
                 max_model_len: int) -> None:
    """Record a new token, then the stop checks, in order: eos / stop token ids (no text), stop
    strings (while detokenizing), the grammar's end, max_tokens and max_model_len. A check that
    stops the request finishes `seq` (its reason set); releasing it is the engine's."""
    p = seq.params
    grammar_done = False
    if seq.grammar is not None:
        if not seq.grammar.accept_token(token):  # the mask allowed only accepted tokens: a bug if reached
            seq.finish("error", error=f"the grammar rejected token {token}")
            return
        grammar_done = seq.grammar.is_terminated()
    seq.token_ids.append(token)
    m = seq.metrics
    if m.first_token_time is None:
        m.first_token_time = now
    m.token_times.append(now)
    if seq.logprobs is not None:
        seq.logprobs.append(logprobs)
    # A finished grammar allows nothing after its stop token: that ends the request even with ignore_eos.
    if (token == eos_id and (not p.ignore_eos or grammar_done)) or (p.stop_token_ids and token in p.stop_token_ids):
        seq.drop_last_from_text = True  # a stop token adds no text
        seq.finish("stop", stop_reason=token)
    else:
        seq.detokenize(tokenizer)  # may finish on a stop string
    if not seq.is_finished and grammar_done:  # no eos token: the grammar ended on its last text token
        seq.finish("stop")
    if not seq.is_finished and (seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= max_model_len):
        seq.finish("length")


def stream_event(seq: Sequence) -> StreamEvent:
    """The request's text and tokens not yet streamed (and its output once finished)."""
    delta, toks = seq.take_delta()
    finished = seq.is_finished
    logprobs = seq.logprobs[len(seq.logprobs) - len(toks):] if seq.logprobs is not None and toks else None
    return StreamEvent(seq.index, seq.request_id, delta, toks, finished, seq.finish_reason,
                       seq.to_output() if finished else None, logprobs)
