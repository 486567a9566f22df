"""Speculative decoding: proposers draft k tokens, the served model verifies them in one forward.

Files: proposers (`ngram` prompt lookup; `ModelProposer` with its own paged KV cache, for a
`draft` checkpoint and for `self`: the served model with a reduced router top_k and/or skipped
layers), rejection (target distributions, greedy acceptance and rejection sampling), decoder
(`SpecDecoder`: propose before scheduling, take back what was not scheduled, verify, stats), step
(`verify_drafts`: the engine step's verification and rollback).
The options are `moe.engine.spec_config.SpeculativeConfig`; docs/design/speculative.md has the design
and the measurements.
"""

from moe.engine.spec.decoder import SpecDecoder
from moe.engine.spec.step import verify_drafts

__all__ = ["SpecDecoder", "verify_drafts"]
