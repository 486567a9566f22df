"""What the engine hands back: `RequestOutput` (a finished or in-flight request), its
`RequestMetrics`, and the `StreamEvent`s of `LLM.stream` / `LLM.step`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class RequestMetrics:
    """Times are `time.perf_counter()` seconds (intervals, not wall-clock dates)."""

    arrival_time: float
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    token_times: list[float] = field(default_factory=list)  # one per generated token
    finished_time: Optional[float] = None
    num_cached_prompt_tokens: int = 0  # prompt tokens served by the prefix cache on admission
    num_preemptions: int = 0
    spec_steps: int = 0  # speculative decoding: verification steps that had proposals
    spec_proposed: int = 0  # tokens proposed
    spec_accepted: int = 0  # of which accepted by the target model

    @property
    def spec_acceptance_rate(self) -> Optional[float]:
        return self.spec_accepted / self.spec_proposed if self.spec_proposed else None

    @property
    def spec_mean_accepted_length(self) -> Optional[float]:
        """Proposed tokens accepted per verification step (each step also yields one token of its own)."""
        return self.spec_accepted / self.spec_steps if self.spec_steps else None

    @property
    def ttft(self) -> Optional[float]:
        """Time to first token, from arrival."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def tpot(self) -> Optional[float]:
        """Mean time per output token after the first."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)

    @property
    def e2e_latency(self) -> Optional[float]:
        return None if self.finished_time is None else self.finished_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]  # the text prompt (None when token ids were given)
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]  # generated tokens (a final eos / stop token id included)
    finished: bool
    finish_reason: Optional[str]  # "stop" | "length" | "error" | "abort"; None while running
    error: Optional[str] = None
    stop_reason: Optional[object] = None  # the stop string or token id that ended it
    logprobs: Optional[list[dict[int, float]]] = None  # per token: {token_id: logprob}
    metrics: Optional[RequestMetrics] = None

    @property
    def num_generated(self) -> int:
        return len(self.token_ids)


@dataclass
class StreamEvent:
    """One request's progress in one engine step. `index` is the request's position in the
    `stream`/`generate` call that added it (None for `add_request` without one)."""

    index: Optional[int]
    request_id: str
    text_delta: str
    token_ids: list[int]  # tokens generated this step (usually one)
    finished: bool
    finish_reason: Optional[str] = None
    output: Optional[RequestOutput] = None  # the full output when finished
    logprobs: Optional[list] = None  # per token of `token_ids`, when the request asked for logprobs
