"""OpenAI response shapes built from engine outputs and events (no server): finish reasons,
usage, logprobs in both flavours, whole bodies, and the streamed choices."""

from __future__ import annotations

from moe.engine import RequestOutput, StreamEvent
from moe.serve import openai_format as fmt


class Tok:
    """Token t decodes to "t<t>", except 7 and 8, which decode alike (to "dup")."""

    def decode(self, ids, skip_special_tokens=True):
        assert not skip_special_tokens  # logprobs spell special tokens out
        return "".join("dup" if t in (7, 8) else f"t{t}" for t in ids)


def out(token_ids, logprobs=None, reason="length", text="") -> RequestOutput:
    return RequestOutput("r", None, [1, 2], text, token_ids, True, reason, logprobs=logprobs)


def ev(token_ids, text="", finished=False, reason=None, logprobs=None, output=None) -> StreamEvent:
    return StreamEvent(0, "r", text, token_ids, finished, reason, output, logprobs)


def test_finish_reasons_and_usage():
    assert [fmt.finish_reason(r) for r in ("stop", "length", "abort", "error", None)] == \
        ["stop", "length", "abort", "error", None]
    assert fmt.chunk_finish(ev([3])) is None and fmt.chunk_finish(ev([], finished=True, reason="stop")) == "stop"
    assert fmt.usage([[1, 2, 3], [4]], [out([5, 6]), out([7])]) == \
        {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


def test_token_texts_cache_and_no_tokenizer():
    texts = fmt.TokenTexts(Tok(), max_cached=1)
    assert texts(3) == "t3" and texts(4) == "t4" and texts(3) == "t3"
    assert list(texts._cache) == [3]  # bounded
    assert fmt.TokenTexts(None)(42) == "42"


def test_chat_logprobs():
    texts = fmt.TokenTexts(Tok())
    lps = [{3: -0.1, 4: -2.0, 5: -3.0}, None, {6: -0.5}]
    content = fmt.chat_logprobs(texts, [3, 9, 6], lps, top_n=2)
    assert [c["token"] for c in content] == ["t3", "t6"]  # a token without logprobs is skipped
    assert content[0]["logprob"] == -0.1 and content[0]["bytes"] == list(b"t3")
    assert [(t["token"], t["logprob"]) for t in content[0]["top_logprobs"]] == [("t3", -0.1), ("t4", -2.0)]


def test_completion_logprobs_offsets_and_alike_tokens():
    texts = fmt.TokenTexts(Tok())
    lp = fmt.completion_logprobs(texts, [3, 10], [{3: -0.2, 7: -1.0, 8: -0.5}, {10: -0.3}], top_n=3, offset=5)
    assert lp["tokens"] == ["t3", "t10"] and lp["token_logprobs"] == [-0.2, -0.3]
    assert lp["text_offset"] == [5, 7]
    assert lp["top_logprobs"][0] == {"t3": -0.2, "dup": -0.5}  # 7 and 8 read alike: the likelier one stays


def test_whole_bodies():
    texts = fmt.TokenTexts(Tok())
    head = {"id": "x", "model": "m"}
    outs = [out([3], [{3: -0.1}], "stop", "t3"), out([4, 5], [{4: -1.0}, {5: -2.0}], "length", "t4t5")]
    chat = fmt.chat_completion(head, outs, [[1, 2]], texts, top_n=0)
    assert chat["object"] == "chat.completion" and chat["id"] == "x"
    assert [c["message"] for c in chat["choices"]] == [{"role": "assistant", "content": "t3"},
                                                      {"role": "assistant", "content": "t4t5"}]
    assert [c["finish_reason"] for c in chat["choices"]] == ["stop", "length"]
    assert [len(c["logprobs"]["content"]) for c in chat["choices"]] == [1, 2]
    assert chat["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    text = fmt.text_completion(head, outs, [[1, 2]], texts, top_n=None)
    assert [(c["index"], c["text"], c["logprobs"]) for c in text["choices"]] == [(0, "t3", None), (1, "t4t5", None)]


def test_streamed_chat_choices():
    chunks = fmt.ChatChunks(2, fmt.TokenTexts(Tok()), top_n=None)
    assert [c["delta"] for c in chunks.preamble()] == [{"role": "assistant", "content": ""}] * 2
    assert chunks.choice(0, ev([3], text="")) is None  # nothing to send (text held back)
    assert chunks.choice(1, ev([3], text="ab")) == {"index": 1, "delta": {"content": "ab"}, "logprobs": None,
                                                     "finish_reason": None}
    assert chunks.choice(1, ev([], finished=True, reason="stop")) == {"index": 1, "delta": {}, "logprobs": None,
                                                                      "finish_reason": "stop"}


def test_streamed_logprobs_come_once_each():
    texts = fmt.TokenTexts(Tok())
    chunks = fmt.ChatChunks(1, texts, top_n=1)
    first = chunks.choice(0, ev([3], text="t3", logprobs=[{3: -0.1}]))
    assert [c["token"] for c in first["logprobs"]["content"]] == ["t3"]
    # an event without its own logprobs (an error event) takes the rest from the final output
    final = out([3, 4, 5], [{3: -0.1}, {4: -0.2}, {5: -0.3}])
    last = chunks.choice(0, ev([], finished=True, reason="length", output=final))
    assert [c["token"] for c in last["logprobs"]["content"]] == ["t4", "t5"]
    # completions: text offsets run on across chunks
    comp = fmt.CompletionChunks(1, texts, top_n=1)
    assert comp.preamble() == []
    a = comp.choice(0, ev([3], text="t3", logprobs=[{3: -0.1}]))
    b = comp.choice(0, ev([10], text="t10", logprobs=[{10: -0.1}], finished=True, reason="length"))
    assert a["logprobs"]["text_offset"] == [0] and b["logprobs"]["text_offset"] == [2]
    assert b["finish_reason"] == "length" and b["text"] == "t10"
