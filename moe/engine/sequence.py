"""One request inside the engine (`Sequence`: its tokens, KV blocks, sampling state and output
text), and `ScheduledBatch`: the sequences one step runs, as the scheduler hands them to the runner.

`token_ids` is prompt + generated tokens. `num_computed_tokens` of them have their K/V in the
cache; each step feeds the next chunk `token_ids[num_computed_tokens:...]` and, once a step
reaches the end of `token_ids`, samples one new token. Preemption (recompute) drops the blocks
and sets `num_computed_tokens` back to 0; the generated tokens stay and are recomputed with
the prompt when the sequence is resumed.

Text is decoded incrementally (vLLM's offsets scheme): only characters that are complete are
committed, so a multi-byte character split across tokens never streams as a replacement
character. With stop strings, the last `max(len(stop)) - 1` characters are held back from the
stream until no stop string can still start in them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

import torch

from moe.engine.outputs import RequestMetrics, RequestOutput
from moe.engine.sampling.sampler import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, request_id: str, prompt: Optional[str], prompt_token_ids: list[int],
                 params: SamplingParams, arrival_time: float, index: Optional[int] = None,
                 generator: Optional[torch.Generator] = None):
        self.request_id, self.index, self.prompt = request_id, index, prompt
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params, self.generator = params, generator
        self.grammar = None  # the xgrammar matcher of a guided request (moe.engine.sampling.guided); None: unconstrained
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # chained hashes of the full blocks registered so far
        # Per-step costs independent of the context length: the chained hashes of token_ids' full blocks, each
        # computed once (BlockManager); block_table mirrored into a growing int32 tensor, appended in place
        # (moe.engine.runner.block_tables: `num_synced_blocks` leading entries are current, lowered by the block manager
        # when it replaces or shortens the table); the repetition penalty's token counts (moe.engine.sampling.penalties).
        self.token_hashes: list[bytes] = []
        self.prefix_match = None  # (the block manager's cache epoch, the hits) of the last prefix lookup
        self.block_table_tensor: Optional[torch.Tensor] = None
        self.num_synced_blocks = 0
        self.kv_group_tables: list = []  # a hybrid model's tables of KV groups 1.. (moe.engine.memory.hybrid_blocks)
        self.token_counts = None
        # speculative decoding (moe.engine.speculative): the last `num_draft_tokens` of token_ids are proposals not yet
        # verified, put there for one step; `draft_probs` [k, V] the proposer's distribution (None: deterministic)
        self.spec = None  # the request's resolved SpeculativeConfig (None: plain decoding)
        self.num_draft_tokens = 0
        self.draft_probs = None
        self.logprobs: Optional[list[dict[int, float]]] = [] if params.logprobs is not None else None
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        self.finish_reason: Optional[str] = None
        self.stop_reason = None
        self.error: Optional[str] = None
        # incremental detokenization state (offsets into the generated tokens)
        self.text = ""
        self._prefix_offset = 0
        self._read_offset = 0
        self._sent_chars = 0
        self._sent_tokens = 0
        self.drop_last_from_text = False  # set when a stop token ended the request: it adds no text
        stops = params.stop or []
        self._holdback = max((len(s) for s in stops), default=1) - 1

    # ------------------------------------------------------------------ token views
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def _text_tokens(self, start: int, end: Optional[int] = None) -> list[int]:
        """Output tokens [start:end] that make text (a stop token adds none), sliced from
        token_ids directly: no copy of the whole output per step."""
        n = self.num_output_tokens - (1 if self.drop_last_from_text else 0)
        end = n if end is None else min(end, n)
        return self.token_ids[self.num_prompt_tokens + start:self.num_prompt_tokens + max(start, end)]

    @property
    def _num_text_tokens(self) -> int:
        return self.num_output_tokens - (1 if self.drop_last_from_text else 0)

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    # ------------------------------------------------------------------ text
    def detokenize(self, tokenizer) -> None:
        """Commit the newly completed characters of the output to `self.text`; finish the
        request if a stop string appeared (the text is cut before it)."""
        if tokenizer is None:
            return
        prefix_text = tokenizer.decode(self._text_tokens(self._prefix_offset, self._read_offset))
        new_text = tokenizer.decode(self._text_tokens(self._prefix_offset))
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return  # nothing new, or a character still incomplete
        old_len = len(self.text)
        self.text += new_text[len(prefix_text):]
        self._prefix_offset, self._read_offset = self._read_offset, self._num_text_tokens
        if self.params.stop:
            start = max(0, old_len - self._holdback)
            hits = [(i, s) for s in self.params.stop if (i := self.text.find(s, start)) >= 0]
            if hits:
                i, s = min(hits)
                self.text = self.text[:i]
                self.finish("stop", stop_reason=s)

    def flush_text(self, tokenizer) -> None:
        """At the end (not after a stop string): commit the incomplete tail as decoded."""
        if tokenizer is None or self.finish_reason == "stop" and isinstance(self.stop_reason, str):
            return
        n = self._num_text_tokens
        if self._read_offset < n:
            prefix_text = tokenizer.decode(self._text_tokens(self._prefix_offset, self._read_offset))
            self.text += tokenizer.decode(self._text_tokens(self._prefix_offset))[len(prefix_text):]
            self._prefix_offset = self._read_offset = n

    def take_delta(self) -> tuple[str, list[int]]:
        """Text and tokens not yet streamed (text held back while a stop string may be forming)."""
        limit = len(self.text) if self.is_finished else max(self._sent_chars, len(self.text) - self._holdback)
        delta = self.text[self._sent_chars:limit]
        self._sent_chars = limit
        new_tokens = self.token_ids[self.num_prompt_tokens + self._sent_tokens:]
        self._sent_tokens = self.num_output_tokens
        return delta, new_tokens

    # ------------------------------------------------------------------ lifecycle
    def finish(self, reason: str, stop_reason=None, error: Optional[str] = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.token_counts = None  # [V] counts: free them now, the request may stay until reported
        self.finish_reason, self.stop_reason, self.error = reason, stop_reason, error

    def to_output(self) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.token_ids[:self.num_prompt_tokens],
            text=self.text, token_ids=self.output_token_ids, finished=self.is_finished,
            finish_reason=self.finish_reason, error=self.error, stop_reason=self.stop_reason,
            logprobs=list(self.logprobs) if self.logprobs is not None else None, metrics=self.metrics)

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})")


@dataclass
class ScheduledBatch:
    """Decodes (one new token) first, then prefill chunks; `num_new_tokens[i]` for `seqs[i]`."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_decodes: int = 0
    preempted: list[Sequence] = field(default_factory=list)
    failed: list[Sequence] = field(default_factory=list)  # could not be served at all

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.seqs)


@dataclass
class NewTokens:
    """What one step yields for one sequence, whoever produced it: the tokens to append, in order
    (one from the sampler; the accepted proposals plus one token of the target's from the
    speculative verifier), each one's logprobs (None entries when the request asked for none), or
    the error that ends the request. The engine applies every one the same way
    (`moe.engine.core.output`)."""

    seq: Sequence
    token_ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    error: Optional[str] = None
