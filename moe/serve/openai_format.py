"""OpenAI's response shapes, built from the engine's outputs and events: finish reasons,
logprobs (chat and completions flavours), usage, whole completion bodies, and the `choices`
entries of streamed chunks. Pure formatting: no I/O, no engine calls."""

from __future__ import annotations

from typing import Optional

from moe.engine import RequestOutput, StreamEvent

OPENAI_FINISH = {"stop": "stop", "length": "length", "abort": "abort", "error": "error"}


def finish_reason(reason: Optional[str]) -> Optional[str]:
    return OPENAI_FINISH.get(reason, reason)


def chunk_finish(ev: StreamEvent) -> Optional[str]:
    """The OpenAI finish_reason of a streamed event (None until the choice finishes)."""
    return finish_reason(ev.finish_reason) if ev.finished else None


def usage(prompts: list[list[int]], outputs: list[RequestOutput]) -> dict:
    p = sum(len(ids) for ids in prompts)
    c = sum(len(o.token_ids) for o in outputs)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


# ---------------------------------------------------------------------------- logprobs
class TokenTexts:
    """Token id -> its text as logprobs show it (special tokens spelled out), cached: the same
    few thousand tokens come up again and again."""

    def __init__(self, tokenizer, max_cached: int = 1_000_000):
        self.tokenizer, self.max_cached = tokenizer, max_cached
        self._cache: dict[int, str] = {}

    def __call__(self, tid: int) -> str:
        s = self._cache.get(tid)
        if s is None:
            s = self.tokenizer.decode([tid], skip_special_tokens=False) if self.tokenizer is not None else str(tid)
            if len(self._cache) < self.max_cached:
                self._cache[tid] = s
        return s


def chat_logprobs(texts: TokenTexts, token_ids, lps, top_n: int) -> list[dict]:
    """The `logprobs.content` list of a chat choice: per token its text, logprob, bytes and top-N."""
    content = []
    for tid, d in zip(token_ids, lps):
        if d is None:
            continue
        s = texts(tid)
        top = sorted(d.items(), key=lambda kv: -kv[1])[:top_n]
        content.append({"token": s, "logprob": d[tid], "bytes": list(s.encode()),
                        "top_logprobs": [{"token": texts(t), "logprob": v, "bytes": list(texts(t).encode())}
                                         for t, v in top]})
    return content


def completion_logprobs(texts: TokenTexts, token_ids, lps, top_n: int, offset: int = 0) -> dict:
    """The legacy completions `logprobs` object; `offset` is where the text of these tokens starts."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tid, d in zip(token_ids, lps):
        if d is None:
            continue
        s = texts(tid)
        out["tokens"].append(s)
        out["token_logprobs"].append(d[tid])
        top: dict[str, float] = {}
        for t, v in sorted(d.items(), key=lambda kv: -kv[1])[:top_n]:
            top.setdefault(texts(t), v)  # tokens that decode alike: keep the likelier
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(s)
    return out


def streamed_logprobs(ev: StreamEvent, sent: int):
    """(token ids, logprobs) of an event not yet streamed: the event's own, or (an event without
    them) the rest of the final output's, from token `sent` on."""
    if ev.logprobs is not None:
        return ev.token_ids, ev.logprobs
    if ev.finished and ev.output is not None and ev.output.logprobs is not None:
        return ev.output.token_ids[sent:], ev.output.logprobs[sent:]
    return [], []


# ---------------------------------------------------------------------------- whole responses
def chat_completion(head: dict, outs: list[RequestOutput], prompts: list[list[int]], texts: TokenTexts,
                    top_n: Optional[int]) -> dict:
    return {**head, "object": "chat.completion", "choices": [{
        "index": i, "message": {"role": "assistant", "content": o.text},
        "logprobs": {"content": chat_logprobs(texts, o.token_ids, o.logprobs, top_n)} if top_n is not None else None,
        "finish_reason": finish_reason(o.finish_reason)} for i, o in enumerate(outs)],
        "usage": usage(prompts, outs)}


def text_completion(head: dict, outs: list[RequestOutput], prompts: list[list[int]], texts: TokenTexts,
                    top_n: Optional[int]) -> dict:
    return {**head, "choices": [{
        "index": i, "text": o.text,
        "logprobs": None if top_n is None else completion_logprobs(texts, o.token_ids, o.logprobs, top_n),
        "finish_reason": finish_reason(o.finish_reason)} for i, o in enumerate(outs)],
        "usage": usage(prompts, outs)}


# ---------------------------------------------------------------------------- streamed choices
class _Chunks:
    """What the streamed chat and text completions share: per event and choice, the logprobs not
    yet sent (formatted by the flavour), and the rule that an event with no text, no logprobs
    and no finish sends nothing (None)."""

    def __init__(self, n_choices: int, texts: TokenTexts, top_n: Optional[int]):
        self.n_choices, self.texts, self.top_n = n_choices, texts, top_n
        self.sent = [0] * n_choices  # tokens whose logprobs went out, per choice

    def preamble(self) -> list[dict]:
        return []

    def choice(self, i: int, ev: StreamEvent) -> Optional[dict]:
        lp = None
        if self.top_n is not None:
            toks, lps = streamed_logprobs(ev, self.sent[i])
            self.sent[i] += len(toks)
            if toks:
                lp = self._logprobs(i, toks, lps)
        if not ev.text_delta and not ev.finished and lp is None:
            return None
        return {"index": i, **self._text(ev), "logprobs": lp, "finish_reason": chunk_finish(ev)}

    def _logprobs(self, i: int, token_ids, lps):
        raise NotImplementedError

    def _text(self, ev: StreamEvent) -> dict:
        raise NotImplementedError


class ChatChunks(_Chunks):
    """The `choices` entries of a streamed chat completion: first a role chunk per choice, then
    one per event with new text, logprobs or the finish (None: nothing to send)."""

    def preamble(self) -> list[dict]:
        return [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                for i in range(self.n_choices)]

    def _logprobs(self, i: int, token_ids, lps) -> dict:
        return {"content": chat_logprobs(self.texts, token_ids, lps, self.top_n)}

    def _text(self, ev: StreamEvent) -> dict:
        return {"delta": {"content": ev.text_delta} if ev.text_delta else {}}


class CompletionChunks(_Chunks):
    """The `choices` entries of a streamed text completion (logprobs' text offsets run on
    across chunks)."""

    def __init__(self, n_choices: int, texts: TokenTexts, top_n: Optional[int]):
        super().__init__(n_choices, texts, top_n)
        self.offset = [0] * n_choices

    def _logprobs(self, i: int, token_ids, lps) -> dict:
        lp = completion_logprobs(self.texts, token_ids, lps, self.top_n, self.offset[i])
        self.offset[i] += sum(len(t) for t in lp["tokens"])
        return lp

    def _text(self, ev: StreamEvent) -> dict:
        return {"text": ev.text_delta}
