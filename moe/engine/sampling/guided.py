"""Structured outputs: grammar-constrained decoding with xgrammar.

    SamplingParams(guided=GuidedParams(json=schema))         # or {"json": schema}
    SamplingParams(guided={"regex": r"\\d{3}-\\d{4}"})        # or choice=[...], grammar=EBNF, json_object=True

A request with `guided` gets a grammar matcher; each step, the token bitmask of every such
sequence that samples is filled (for the whole batch at once, by xgrammar's multi-threaded
batch matcher, on a worker thread while the model forward runs) and applied to its logits
after the raw logprobs are taken and before anything else; the sampled token then advances the
matcher. Requests without `guided` never touch any of this, and the engine builds it (and
imports xgrammar) only on the first guided request.

Why xgrammar: it is the structured-generation engine vLLM and SGLang use, it compiles JSON
schemas, regexes and EBNF grammars to token masks for an arbitrary vocabulary, and it installs
and runs on CPU (`pip install xgrammar`). The JSON-schema compiler is its, not ours.

JSON is generated compactly (`any_whitespace=False`: ", " and ": " separators, no free
whitespace): weak models can loop on whitespace that the grammar allows forever (vLLM has
`disable_any_whitespace` for the same reason). Schemas compile in strict mode (no properties
beyond those listed, unless the schema says `additionalProperties`), as OpenAI's strict
structured outputs require; `json_object` is any JSON object. JSON rows also get a fixed mask
of the tokens holding a raw control character (U+0000-U+001F): compact JSON never has one
(in strings they must be escaped), but xgrammar <= 0.2.9 lets them into strings bounded by
`minLength` / `maxLength` (mlc-ai/xgrammar#800), which strict parsers then reject.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any, Callable, Optional, Union

import torch

from moe.errors import RequestError

KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True)
class GuidedParams:
    """Exactly one of: `json` (a JSON schema, dict or JSON text), `regex`, `choice` (a list of
    strings, the output is one of them), `grammar` (EBNF, xgrammar's GBNF dialect with a
    `root` rule), `json_object=True` (any JSON object)."""

    json: Optional[Union[dict, str]] = None
    regex: Optional[str] = None
    choice: Optional[list] = None
    grammar: Optional[str] = None
    json_object: bool = False

    def __post_init__(self):
        given = [k for k in KINDS if (getattr(self, k) is not None if k != "json_object" else self.json_object)]
        if len(given) != 1:
            raise RequestError(f"guided decoding takes exactly one of {list(KINDS)}; got {given or 'none'}",
                               param="guided")
        kind = given[0]
        v = getattr(self, kind)
        if kind == "json":
            if isinstance(v, str):
                try:
                    v = json.loads(v)
                except ValueError as e:
                    raise RequestError(f"the guided JSON schema is not valid JSON: {e}", param="guided") from None
                object.__setattr__(self, "json", v)
            if not isinstance(v, dict):
                raise RequestError(f"a JSON schema must be an object; got {type(v).__name__}", param="guided")
        elif kind in ("regex", "grammar"):
            if not isinstance(v, str) or not v:
                raise RequestError(f"the guided {kind} must be a non-empty string", param="guided")
        elif kind == "choice":
            if not isinstance(v, (list, tuple)) or not v or not all(isinstance(c, str) for c in v):
                raise RequestError("the guided choice must be a non-empty list of strings", param="guided")
            object.__setattr__(self, "choice", list(v))
        elif v is not True:
            raise RequestError("json_object must be True or False", param="guided")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if (getattr(self, k) is not None if k != "json_object" else self.json_object))

    def key(self) -> tuple[str, str]:
        """The compiled-grammar cache key: the kind and its canonical text."""
        kind = self.kind
        if kind == "json":
            return kind, json.dumps(self.json, sort_keys=True, ensure_ascii=False)
        if kind == "choice":
            return kind, json.dumps(self.choice, ensure_ascii=False)
        return kind, "" if kind == "json_object" else getattr(self, kind)

    @classmethod
    def coerce(cls, g) -> "GuidedParams":
        if isinstance(g, cls):
            return g
        if isinstance(g, dict):
            unknown = set(g) - {f.name for f in fields(cls)}
            if unknown:
                raise RequestError(f"unknown guided decoding option(s) {sorted(unknown)}; the options are "
                                   f"{list(KINDS)}", param="guided")
            return cls(**g)
        raise RequestError(f"guided must be a GuidedParams or a dict like {{'json': schema}}; got "
                           f"{type(g).__name__}", param="guided")


def choice_grammar(choices: list[str]) -> str:
    """EBNF whose language is exactly `choices`: JSON string literals are valid EBNF string
    literals (the same escapes), so any text is quoted correctly."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _xgrammar():
    try:
        import xgrammar  # lazy: heavy (imports transformers); only guided requests need it
    except ImportError:
        raise RequestError("structured outputs need xgrammar, which is not installed here "
                           "(pip install xgrammar, or the project's dev extra)", param="guided") from None
    return xgrammar


def special_token_ids(tokenizer) -> set[int]:
    """The ids of the tokenizer's special tokens (eos, chat markers ...): they carry no text."""
    ids = set(getattr(tokenizer, "special_ids", {}).values())
    hf = getattr(tokenizer, "tok", None)  # moe.hf.io.HFTokenizer wraps a transformers tokenizer
    if hf is not None:
        ids |= set(getattr(hf, "all_special_ids", []))
        ids |= {i for i, t in getattr(hf, "added_tokens_decoder", {}).items() if t.special}
    return {i for i in ids if i is not None}


def tokenizer_info(tokenizer, vocab_size: int, stop_ids: list[int]):
    """xgrammar's view of the vocabulary: every token id's text, decoded the tokenizer's way.

    moe.data.Tokenizer is byte-level BPE (GPT-2's byte-to-unicode alphabet in the vocabulary
    strings, no prefix space); moe.hf.io.HFTokenizer wraps a transformers tokenizer, whose
    encoding (byte-level, byte-fallback, sentencepiece, tiktoken) xgrammar detects. Either way,
    special tokens are given as empty strings, which xgrammar treats as special: they decode to
    no text, so the grammar never allows them (but for the stop tokens at the end); without this
    "<|end|>" would count as seven characters of a JSON string."""
    xgr = _xgrammar()
    hf = getattr(tokenizer, "tok", None)
    if hf is not None:
        vocab = hf.get_vocab()
        detected = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=stop_ids or None)
        vocab_type, prefix_space = detected.vocab_type, detected.add_prefix_space
    elif hasattr(tokenizer, "backend"):  # moe.data.Tokenizer: a tokenizers.Tokenizer with ByteLevel decoding
        vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
        vocab_type, prefix_space = xgr.VocabType.BYTE_LEVEL, False
    else:
        raise RequestError(f"structured outputs need the vocabulary of the tokenizer; {type(tokenizer).__name__} "
                           "is neither moe.data.Tokenizer nor moe.hf.io.HFTokenizer", param="guided")
    special = special_token_ids(tokenizer)
    encoded = [""] * vocab_size
    for text, i in vocab.items():
        if i < vocab_size and i not in special:
            encoded[i] = text
    return xgr.TokenizerInfo(encoded, vocab_type, vocab_size=vocab_size, stop_token_ids=stop_ids or None,
                             add_prefix_space=prefix_space)


def pack_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """A bool [V] tensor as one xgrammar bitmask row (int32 words, token i = bit i % 32 of word i // 32)."""
    words = -(-allowed.numel() // 32)
    bits = torch.zeros(words * 32, dtype=torch.int64)
    bits[:allowed.numel()] = allowed.to(torch.int64)
    packed = (bits.view(words, 32) << torch.arange(32)).sum(-1)  # in [0, 2**32)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


class SequenceGrammar:
    """One sequence's grammar state: xgrammar's matcher, and whether its output is JSON."""

    __slots__ = ("matcher", "is_json")

    def __init__(self, matcher, is_json: bool):
        self.matcher, self.is_json = matcher, is_json

    def accept_token(self, token: int) -> bool:
        return self.matcher.accept_token(token)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()


def _clean(e: Exception) -> str:
    """xgrammar's message without its "[hh:mm:ss] /path/file.cc:123: " prefix."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return re.sub(r"^\[[\d:]+\]\s*\S+:\d+:\s*", "", text)


class GuidedDecoder:
    """One engine's structured-output machinery: the vocabulary, the compiler, an LRU cache of
    compiled grammars (by kind and canonical spec), matchers, and the per-step batch masks."""

    def __init__(self, tokenizer, vocab_size: int, eos_id: Optional[int], cache_size: int = 256):
        if tokenizer is None:
            raise RequestError("structured outputs need a tokenizer (the grammar is over text)", param="guided")
        self.xgr = xgr = _xgrammar()
        self.vocab_size = vocab_size
        self.stop_ids = [eos_id] if eos_id is not None else []
        self.info = tokenizer_info(tokenizer, vocab_size, self.stop_ids)
        threads = max(1, min(4, os.cpu_count() or 1))
        # xgrammar's own cache is unbounded by default: ours below is bounded by count.
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=threads, cache_enabled=False)
        self.batch = xgr.BatchGrammarMatcher(threads)
        no_control = torch.tensor([not any(b < 0x20 for b in text) for text in self.info.decoded_vocab[:vocab_size]]
                                  + [True] * max(0, vocab_size - len(self.info.decoded_vocab)))
        self.json_safe = pack_bitmask(no_control)  # special tokens decode to b"": allowed here, xgrammar decides
        self.cache: OrderedDict = OrderedDict()
        self.cache_size = cache_size
        self._lock = threading.Lock()  # validate_request may compile on the server's loop while the engine steps
        self._worker: Optional[ThreadPoolExecutor] = None
        self.reset_stats()

    # ------------------------------------------------------------------ grammars
    def compile(self, g: GuidedParams):
        """The compiled grammar of `g` (cached); a RequestError(param="guided") if it is invalid."""
        key = g.key()
        with self._lock:
            hit = self.cache.get(key)
            if hit is not None:
                self.cache.move_to_end(key)
                self.cache_hits += 1
                return hit
            try:
                compiled = self._compile(g)
            except RequestError:
                raise
            except Exception as e:  # xgrammar raises RuntimeError / ValueError with the parser's message
                raise RequestError(f"invalid guided {g.kind}: {_clean(e)}", param="guided") from None
            self.cache_misses += 1
            self.cache[key] = compiled
            if len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
            return compiled

    def _compile(self, g: GuidedParams):
        kind, c = g.kind, self.compiler
        if kind == "json":
            return c.compile_json_schema(json.dumps(g.json), any_whitespace=False, strict_mode=True)
        if kind == "json_object":
            return c.compile_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
        if kind == "regex":
            return c.compile_regex(g.regex)
        if kind == "choice":
            return c.compile_grammar(choice_grammar(g.choice))
        return c.compile_grammar(g.grammar)

    def matcher(self, g: GuidedParams) -> SequenceGrammar:
        """A fresh grammar state for one sequence. Without an eos token the grammar ends by itself."""
        matcher = self.xgr.GrammarMatcher(self.compile(g), terminate_without_stop_token=not self.stop_ids)
        return SequenceGrammar(matcher, g.kind in ("json", "json_object"))

    # ------------------------------------------------------------------ the step
    def start_masks(self, grammars: list[Optional[SequenceGrammar]]) -> Future:
        """Fill the bitmask of `grammars` (None rows: unconstrained, left all-allowed) on the
        worker thread (xgrammar's calls release the GIL, so this overlaps the model forward);
        `wait(future)` gives the [len(matchers), ceil(V/32)] int32 bitmask."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="moe-guided")
        return self._worker.submit(self._fill, list(grammars))

    def _fill(self, grammars: list[Optional[SequenceGrammar]]) -> tuple[torch.Tensor, float]:
        t0 = time.perf_counter()
        bitmask = self.xgr.allocate_token_bitmask(len(grammars), self.vocab_size)
        rows = [i for i, g in enumerate(grammars) if g is not None]
        self.batch.batch_fill_next_token_bitmask([grammars[i].matcher for i in rows], bitmask, indices=rows)
        json_rows = [i for i in rows if grammars[i].is_json]
        if json_rows:
            bitmask[json_rows] &= self.json_safe
        return bitmask, time.perf_counter() - t0

    def wait(self, job: Future) -> torch.Tensor:
        """The bitmask of `start_masks`, once filled; the time the step waited for it counts
        in `guided_mask_wait_s` (the fill time not hidden behind the forward)."""
        t0 = time.perf_counter()
        bitmask, fill_s = job.result()
        self.mask_wait_s += time.perf_counter() - t0
        self.fill_s += fill_s
        self.num_steps += 1
        return bitmask

    def mask_fn(self, bitmask: torch.Tensor, guided_rows: list[int]) -> Callable[[torch.Tensor], None]:
        """The in-place logits mask for the sampler: rows `guided_rows` of the logits get row
        for row the same rows of `bitmask` (disallowed tokens -> -inf)."""
        def apply(logits: torch.Tensor) -> None:
            t0 = time.perf_counter()
            self.xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True),
                                                 vocab_size=self.vocab_size, indices=guided_rows)
            self.apply_s += time.perf_counter() - t0
        return apply

    def mask_drafts(self, grammar: SequenceGrammar, drafts: list[int], logits_RV: torch.Tensor) -> None:
        """Mask the verification rows of a drafted sequence in place: row j gets the grammar's mask
        after `drafts[:j]` (vLLM's structured outputs with speculation do the same), so each row is
        exactly the distribution plain guided decoding would sample from there. The matcher is
        advanced over the drafts it accepts and rolled back afterwards; the engine advances it over
        the tokens verification emits. Rows after the first draft the grammar refuses (or after its
        end) stay unmasked: that draft's target probability is 0, so verification stops there."""
        R = logits_RV.shape[0]
        bitmask = self.xgr.allocate_token_bitmask(R, self.vocab_size)  # all allowed
        advanced = 0
        for j in range(R):
            grammar.matcher.fill_next_token_bitmask(bitmask, j)
            if j == len(drafts) or not grammar.accept_token(drafts[j]):
                break
            advanced += 1
            if grammar.is_terminated():
                break
        if advanced:
            grammar.matcher.rollback(advanced)
        if grammar.is_json:
            bitmask &= self.json_safe
        self.xgr.apply_token_bitmask_inplace(logits_RV, bitmask.to(logits_RV.device), vocab_size=self.vocab_size)

    def stats(self) -> dict[str, Any]:
        """Cache size and hits; steps with guided rows; seconds spent filling masks (on the
        worker, overlapping the forward), waiting for them after the forward, applying them."""
        return dict(guided_cache_size=len(self.cache), guided_cache_hits=self.cache_hits,
                    guided_cache_misses=self.cache_misses, guided_steps=self.num_steps,
                    guided_mask_fill_s=self.fill_s, guided_mask_wait_s=self.mask_wait_s,
                    guided_mask_apply_s=self.apply_s)

    def reset_stats(self) -> None:
        self.cache_hits = self.cache_misses = self.num_steps = 0
        self.fill_s = self.mask_wait_s = self.apply_s = 0.0

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=False)
            self._worker = None
