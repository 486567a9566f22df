"""Sampling parameters and the batched sampler.

Logits processing follows HF transformers' order: repetition penalty -> temperature -> top-k ->
top-p -> min-p, each mask computed on the distribution left by the previous one. `temperature=0`
is greedy (argmax after the repetition penalty). Random draws use the "exponential race"
(`argmax(p / E)`, `E ~ Exp(1)`), which samples exactly from `p`; a request with a `seed` draws
its noise from its own `torch.Generator`, so its output does not depend on what else is in the
batch, on chunking or on preemption. Logprobs are those of the raw model distribution
(`log_softmax` of the logits, before penalty and temperature), as vLLM reports them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Callable, Optional, Sequence, Union

import torch

from moe.engine.config import SpeculativeConfig
from moe.engine.sampling.guided import GuidedParams
from moe.engine.sampling.penalties import TokenCounts
from moe.errors import ConfigError, RequestError


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # in (0, 1]; 1 = off
    top_k: int = -1  # -1 or 0 = off
    min_p: float = 0.0  # in [0, 1]; 0 = off
    repetition_penalty: float = 1.0  # > 0; 1 = off (HF/CTRL: positive logits / p, negative * p)
    seed: Optional[int] = None
    max_tokens: int = 16
    stop_token_ids: Optional[list[int]] = None
    stop: Optional[Union[str, list[str]]] = None  # stop strings (left out of the text)
    ignore_eos: bool = False
    logprobs: Optional[int] = None  # top-N logprobs per generated token (plus the chosen one)
    guided: Optional[GuidedParams] = None  # structured output (JSON schema, regex, choice, grammar): moe.engine.sampling.guided
    # speculative decoding of this request (moe.engine.speculative): None = the engine's default, "off", a method
    # name ("ngram" | "draft" | "self"), a dict of SpeculativeConfig options or a SpeculativeConfig
    speculative: Optional[Union[str, dict, SpeculativeConfig]] = None

    def __post_init__(self):
        self.validate()

    def validate(self) -> "SamplingParams":
        """Raise a RequestError (a ValueError) naming the first bad field in its message and in
        `param` (also usable after mutating the object)."""
        def bad(name, why):
            raise RequestError(f"SamplingParams.{name}={getattr(self, name)!r} {why}", param=name)

        def number(name):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                bad(name, "must be a finite number")
            return v

        def integer(name):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                bad(name, "must be an int")
            return v

        if number("temperature") < 0:
            bad("temperature", "must be >= 0 (0 = greedy)")
        if not 0 < number("top_p") <= 1:
            bad("top_p", "must be in (0, 1]")
        if integer("top_k") < -1:
            bad("top_k", "must be -1 or 0 (off) or a positive int")
        if not 0 <= number("min_p") <= 1:
            bad("min_p", "must be in [0, 1]")
        if number("repetition_penalty") <= 0:
            bad("repetition_penalty", "must be > 0 (1 = off)")
        if self.seed is not None:
            integer("seed")
        if integer("max_tokens") < 1:
            bad("max_tokens", "must be >= 1")
        if self.stop_token_ids is not None:
            if isinstance(self.stop_token_ids, int):
                self.stop_token_ids = [self.stop_token_ids]
            if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids):
                bad("stop_token_ids", "must be a list of non-negative ints")
        if self.stop is not None:
            if isinstance(self.stop, str):
                self.stop = [self.stop]
            if not all(isinstance(s, str) and s for s in self.stop):
                bad("stop", "must be a non-empty string or a list of non-empty strings")
        if not isinstance(self.ignore_eos, bool):
            bad("ignore_eos", "must be a bool")
        if self.logprobs is not None and integer("logprobs") < 0:
            bad("logprobs", "must be None or >= 0")
        if self.guided is not None:
            self.guided = GuidedParams.coerce(self.guided)  # a dict like {"json": schema} is accepted too
        if self.speculative is not None:
            try:
                self.speculative = SpeculativeConfig.coerce(self.speculative, allow_off=True)
            except ConfigError as e:
                raise RequestError(f"SamplingParams: {e}", param="speculative") from None
            if isinstance(self.speculative, SpeculativeConfig) and self.speculative.model is not None:
                bad("speculative", "cannot name a draft model: the draft model is an engine option "
                    "(LLM(..., speculative={'method': 'draft', 'model': ...}))")
        return self

    @classmethod
    def coerce(cls, p) -> "SamplingParams":
        """A SamplingParams from None (defaults), a dict of fields, or a SamplingParams (re-validated)."""
        if p is None:
            return cls()
        if isinstance(p, dict):
            unknown = set(p) - {f.name for f in fields(cls)}
            if unknown:
                raise RequestError(f"unknown SamplingParams field(s) {sorted(unknown)}; the fields are "
                                   f"{[f.name for f in fields(cls)]}")
            return cls(**p)
        if isinstance(p, cls):
            return p.validate()
        raise RequestError(f"sampling params must be a SamplingParams or a dict; got {type(p).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def top_k_active(self) -> bool:
        return self.top_k > 0


# ------------------------------------------------------------------------------ logits processing

def apply_repetition_penalty(logits: torch.Tensor, token_ids: Sequence[Union[Sequence[int], TokenCounts]],
                             penalties) -> torch.Tensor:  # a new tensor: `logits` is left as it is
    """Every token already in row i's context: logit / p if positive, logit * p otherwise.
    `token_ids[i]`: the context's ids, or its `TokenCounts` (no scan of the context: rows with
    counts are penalised together, one masked op per distinct penalty value, with the same
    scalar arithmetic as the list path, so both give identical logits)."""
    out, groups = None, {}
    for i, (ids, p) in enumerate(zip(token_ids, penalties)):
        if p == 1.0:
            continue
        if isinstance(ids, TokenCounts):
            groups.setdefault(p, []).append(i)
            continue
        if not ids:
            continue
        out = logits.clone() if out is None else out
        idx = torch.tensor(sorted(set(ids)), device=logits.device, dtype=torch.long)
        seen = out[i, idx]
        out[i, idx] = torch.where(seen > 0, seen / p, seen * p)
    for p, rows in groups.items():
        seen_RV = torch.stack([token_ids[i].seen_V for i in rows])
        if len(rows) == logits.shape[0]:  # every row (the usual case): no gather, no scatter, no copy
            x = logits if out is None else out
            out = torch.where(seen_RV, torch.where(x > 0, x / p, x * p), x)
            continue
        out = logits.clone() if out is None else out
        idx = torch.tensor(rows, device=logits.device)
        x = out[idx]
        out[idx] = torch.where(seen_RV, torch.where(x > 0, x / p, x * p), x)
    return logits.clone() if out is None else out


def top_k_top_p_min_p_mask(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                           min_p: torch.Tensor) -> torch.Tensor:
    """Logits with the tokens removed by top-k, then top-p, then min-p set to -inf.

    top_k [B] long (<= 0 = off; ties with the k-th value are kept, as HF does), top_p [B]
    (keeps the smallest set of most likely tokens whose probability sums to >= top_p),
    min_p [B] (removes tokens less likely than min_p times the most likely one).
    """
    B, V = logits.shape
    sorted_l, order = logits.sort(dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=V), torch.full_like(top_k, V))
    kth = sorted_l.gather(1, (k - 1).unsqueeze(1))
    sorted_l = sorted_l.masked_fill(sorted_l < kth, float("-inf"))
    probs = torch.softmax(sorted_l, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the strictly more likely tokens
    # The most likely token always survives (nothing is before it); top_p == 1 removes nothing
    # even where rounding pushes the cumulative sum past 1.
    top_p = top_p.unsqueeze(1)
    sorted_l = sorted_l.masked_fill((before >= top_p) & (top_p < 1), float("-inf"))
    probs = torch.softmax(sorted_l, dim=-1)
    sorted_l = sorted_l.masked_fill(probs < min_p.unsqueeze(1) * probs[:, :1], float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, sorted_l)


def row_argmax(x_BV: torch.Tensor) -> torch.Tensor:
    """`x.argmax(dim=-1)`: each row's first index of its maximum (of its first NaN where it has one).
    On the CPU through `max(dim=-1)`, which returns the same index (tests/engine/sampling/
    test_sampler_rows.py checks ties, infinities and NaNs) at a third of the cost: argmax's CPU
    reduction over 4,096 logits is not vectorised (350 vs 116 us at 64 rows;
    docs/results/generate/plan_1205). Elsewhere argmax itself."""
    return x_BV.max(dim=-1).indices if x_BV.device.type == "cpu" else x_BV.argmax(dim=-1)


def finite_rows(logits_BV: torch.Tensor) -> list[bool]:
    """Whether each row holds only finite values. A sum is finite only if all of its terms are (an
    infinity makes it infinite or NaN, a NaN makes it NaN), so one sum of the whole step settles the
    usual all-finite step; only a step with a non-finite sum (or finite values whose sum overflows) is
    checked element by element. `isfinite(x).all(-1)` is the cost of several passes: 574 vs 16 us
    at 64 x 4,096 on the development CPU (docs/results/generate/plan_1205). One sum and one read, not
    row sums, isfinite, all and a read: right after a forward has streamed the weights through the
    caches each torch call costs tens of microseconds (docs/results/generate/host_1205)."""
    if math.isfinite(logits_BV.sum().item()):
        return [True] * logits_BV.shape[0]
    return torch.isfinite(logits_BV).all(dim=-1).tolist()


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[Optional[dict[int, float]]]  # per row: {token: logprob} (top-N + chosen), or None


class Sampler:
    """Samples one token per row of `logits [B, V]`, each row with its own SamplingParams."""

    def __init__(self, seed: Optional[int] = None, device: torch.device = torch.device("cpu")):
        self.device = device
        self.generator = torch.Generator(device=device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def new_request_generator(self, seed: Optional[int]) -> Optional[torch.Generator]:
        if seed is None:
            return None
        return torch.Generator(device=self.device).manual_seed(seed)

    def sample(self, logits: torch.Tensor, params: Sequence[SamplingParams],
               generators: Sequence[Optional[torch.Generator]],
               context_ids: Sequence[Sequence[int]],
               logits_mask: Optional[Callable[[torch.Tensor], None]] = None) -> SampleResult:
        """`context_ids[i]`: the tokens row i's repetition penalty looks at (prompt + output), or
        their `TokenCounts`.
        `logits_mask`: applied in place to the fp32 logits once the raw logprobs are taken,
        before any other processing (grammar token masks, `moe.engine.sampling.guided`); it may write
        into `logits`."""
        logits = logits.float()
        B, V = logits.shape
        if logits_mask is None and all(p.greedy and p.repetition_penalty == 1.0 and p.logprobs is None for p in params):
            # Greedy without processors (the usual evaluation / chat-at-temperature-0 batch): the argmax, which
            # the general path below computes too, and nothing else (no lists, no masks, no logprobs).
            return SampleResult(row_argmax(logits).tolist(), [None] * B)
        want_lp = [p.logprobs is not None for p in params]
        raw_logprobs = torch.log_softmax(logits, dim=-1) if any(want_lp) else None
        if logits_mask is not None:
            logits_mask(logits)

        penalties = [p.repetition_penalty for p in params]
        if any(x != 1.0 for x in penalties):
            logits = apply_repetition_penalty(logits, context_ids, penalties)

        chosen = row_argmax(logits)
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if rows:
            idx = torch.tensor(rows, device=logits.device)
            ps = [params[i] for i in rows]
            temp = torch.tensor([p.temperature for p in ps], device=logits.device).unsqueeze(1)
            scaled = logits[idx] / temp
            if any(p.top_k_active or p.top_p < 1 or p.min_p > 0 for p in ps):
                scaled = top_k_top_p_min_p_mask(
                    scaled, torch.tensor([p.top_k for p in ps], device=logits.device),
                    torch.tensor([p.top_p for p in ps], device=logits.device, dtype=torch.float32),
                    torch.tensor([p.min_p for p in ps], device=logits.device, dtype=torch.float32))
            probs = torch.softmax(scaled, dim=-1)
            noise = torch.empty_like(probs)
            unseeded = [j for j, i in enumerate(rows) if generators[i] is None]
            if unseeded:
                noise[unseeded] = torch.empty(len(unseeded), V, device=logits.device).exponential_(
                    generator=self.generator)
            for j, i in enumerate(rows):
                if generators[i] is not None:
                    noise[j].exponential_(generator=generators[i])
            chosen[idx] = (probs / noise).argmax(dim=-1)

        token_ids = chosen.tolist()
        out_lp: list[Optional[dict[int, float]]] = [None] * B
        if raw_logprobs is not None:
            n_top = max((p.logprobs or 0) for p in params)
            top_v, top_i = raw_logprobs.topk(min(n_top, V), dim=-1) if n_top else (None, None)
            chosen_lp = raw_logprobs.gather(1, chosen.unsqueeze(1)).squeeze(1).tolist()
            top_v = top_v.tolist() if top_v is not None else None
            top_i = top_i.tolist() if top_i is not None else None
            for i, p in enumerate(params):
                if p.logprobs is None:
                    continue
                d = {}
                if p.logprobs:
                    d = {int(t): float(v) for t, v in zip(top_i[i][:p.logprobs], top_v[i][:p.logprobs])}
                d[token_ids[i]] = float(chosen_lp[i])
                out_lp[i] = d
        return SampleResult(token_ids, out_lp)
