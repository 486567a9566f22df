"""Speculative decoding: proposers draft k tokens, the served model verifies them in one forward.

Files: proposers (`ngram` prompt lookup; `ModelProposer` with its own paged KV cache, for a
`draft` checkpoint and for `self`: the served model with a reduced router top_k and/or skipped
layers), rejection (target distributions, greedy acceptance and rejection sampling), decoder
(`SpecDecoder`: propose before scheduling, take back what was not scheduled, verify and return
each sequence's tokens to emit, stats), verifier (the rollback of a verified sequence to its
verified tokens and KV blocks, the logprobs of the emitted tokens).
The options are `moe.engine.config.SpeculativeConfig`; docs/design/speculative.md has the design
and the measurements.
"""

from moe.engine.speculative.decoder import SpecDecoder

__all__ = ["SpecDecoder"]
