"""`ServerState`: what the app's handlers share (the `LLM`, its driver thread, the limits, the
metrics) and the per-request steps that need it: authentication, the model name, tokenizing
(text and chat), and turning an OpenAI request into checked `SamplingParams`.

Requests are checked by the engine's own `validate_request` (the same check `LLM.generate`
applies), called here on the event loop so that bad input answers a 400 before anything
reaches the engine.
"""

from __future__ import annotations

import hmac
import time
from typing import Optional

from starlette.requests import Request

from moe.engine import GuidedParams, SamplingParams
from moe.errors import RequestError
from moe.serve.driver import EngineDriver
from moe.serve.metrics import ServerMetrics
from moe.serve.openai_format import TokenTexts
from moe.serve.protocol import APIError, bad_request, rejected_by_engine


class ServerState:
    def __init__(self, llm, model_name: str, api_key: Optional[str] = None, max_request_bytes: int = 2 * 2**20,
                 max_pending: int = 1024, max_n: int = 16, clip_max_tokens: bool = False, on_fatal=None):
        self.llm = llm
        self.tokenizer = llm.tokenizer
        self.model_name = model_name
        self.api_key = api_key
        self.max_request_bytes, self.max_pending, self.max_n = max_request_bytes, max_pending, max_n
        self.max_model_len = llm.max_model_len
        self.clip_max_tokens = clip_max_tokens
        self.created = int(time.time())
        self.metrics = ServerMetrics()
        self.driver = EngineDriver(llm, on_events=self.metrics.on_events, on_fatal=on_fatal)
        self.token_texts = TokenTexts(self.tokenizer)
        end = getattr(self.tokenizer, "special_ids", {}).get("<|end|>") if self.tokenizer is not None else None
        self.chat_stop_ids = [end] if end is not None else []  # the chat template ends every turn with it

    # ---------------------------------------------------------------- who and what
    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise APIError(401, "Incorrect or missing API key (send 'Authorization: Bearer <key>').",
                           code="invalid_api_key")

    def check_model(self, model: Optional[str]) -> None:
        if model is not None and model != self.model_name:
            raise APIError(400, f"The model `{model}` does not exist; this server serves `{self.model_name}`.",
                           param="model", code="model_not_found")

    # ---------------------------------------------------------------- tokenizing
    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise bad_request("this model has no tokenizer: send the prompt as token ids")
        return list(self.tokenizer.encode(text, add_bos=self.llm.config.add_bos))  # as LLM.generate encodes

    def chat_ids(self, messages) -> list[int]:
        if self.tokenizer is None:
            raise bad_request("this model has no tokenizer (and so no chat template)")
        msgs = [m.as_template_message(i) for i, m in enumerate(messages)]
        try:
            text = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
        except Exception as e:  # ValueError, TypeError, jinja2 errors: the messages' fault
            raise bad_request(f"bad chat messages: {e}", param="messages") from None
        return self.encode(text)

    # ---------------------------------------------------------------- sampling
    def sampling_params(self, req, ids: list[int], max_tokens: Optional[int], logprobs: Optional[int],
                        extra_stop_ids: list[int], prompt_field: str) -> list[SamplingParams]:
        """The `req.n` choices' SamplingParams for prompt `ids`, checked with the engine's
        `validate_request` (a 400 naming the field otherwise). `max_tokens` None takes all the room
        left after the prompt; a `max_tokens` beyond that room is a 400 naming the limit (as the
        OpenAI API and vLLM answer), or, with `clip_max_tokens`, capped to the room. A structured
        output (`response_format`, `guided_*`) is compiled here too: a bad schema, regex or
        grammar is a 400 naming the field it came in."""
        room = self.max_model_len - len(ids)
        if max_tokens is not None and max_tokens > room > 0 and not self.clip_max_tokens:
            raise bad_request(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(ids) + max_tokens} tokens ({len(ids)} in the {prompt_field}, {max_tokens} in the completion); "
                f"with this prompt, max_tokens can be at most {room}. Please reduce the length of the "
                f"{prompt_field} or max_tokens.", param="max_tokens", code="context_length_exceeded")
        mt = max(1, room if max_tokens is None else min(max_tokens, room))  # room < 1: the engine says why
        stop_ids = list(req.stop_token_ids or [])
        if not req.ignore_eos:
            stop_ids += [t for t in extra_stop_ids if t not in stop_ids]
        spec, guided_field = req.guided_spec()
        try:
            guided = GuidedParams.coerce(spec) if spec is not None else None
            params = [SamplingParams(
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=-1 if req.top_k is None else req.top_k,
                min_p=0.0 if req.min_p is None else req.min_p,
                repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                seed=None if req.seed is None else req.seed + j,  # n choices differ, reproducibly
                max_tokens=mt, stop=req.stop, stop_token_ids=stop_ids or None, ignore_eos=req.ignore_eos,
                logprobs=logprobs, guided=guided, speculative=req.speculative) for j in range(req.n)]
            self.llm.validate_request(ids, params[0])  # the choices differ only in their seeds
        except RequestError as e:
            if e.param == "guided":
                raise bad_request(str(e), param=guided_field) from None
            raise rejected_by_engine(e, prompt_field) from None
        return params
