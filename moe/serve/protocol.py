"""OpenAI request schemas (the subset the server honours) and OpenAI-style errors.

Unknown fields are ignored (clients send new ones all the time); fields whose meaning the
engine cannot honour (`echo`, `suffix`, `tools`, non-zero presence/frequency penalties, ...)
are rejected with a 400 rather than silently dropped. vLLM-style extensions are accepted too:
`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `stop_token_ids`, and the structured
outputs `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` (both endpoints),
besides OpenAI's `response_format` (chat: `json_object`, `json_schema`); and moe-lab's own
`speculative` (this request's speculative decoding: "off", a method, or a method with options).
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from moe.errors import RequestError

MAX_STOP = 16  # stop strings per request (OpenAI allows 4)
MAX_TOP_LOGPROBS = 20


class APIError(Exception):
    """An error answered as OpenAI does: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def rejected_by_engine(e: RequestError, prompt_field: str) -> APIError:
    """The engine's `validate_request` error as a 400: its `param` "prompt" becomes the field
    the client sent the prompt in (`messages` for chat), and its `code` passes through
    (`context_length_exceeded`, as OpenAI answers a prompt that is too long)."""
    param = prompt_field if e.param == "prompt" else e.param
    return bad_request(str(e), param=param, code=e.code)


def validation_error(e: ValidationError) -> APIError:
    """The first pydantic error as a 400 naming the field, e.g. `max_tokens: ... >= 1`."""
    err = e.errors(include_url=False)[0]
    loc = ".".join(str(x) for x in err.get("loc", ()))
    msg = err.get("msg", "invalid value")
    return bad_request(f"{loc}: {msg}" if loc else msg, param=loc or None)


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None  # None: the served model
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    n: Optional[int] = Field(1, ge=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = Field(None, ge=-(2**63), le=2**63 - 1)
    stream: Optional[bool] = False
    stream_options: Optional["StreamOptions"] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, float]] = None
    user: Optional[str] = None
    # vLLM-style extensions (pass with the client's extra_body)
    top_k: Optional[int] = Field(None, ge=-1)
    min_p: Optional[float] = Field(None, ge=0, le=1)
    repetition_penalty: Optional[float] = Field(None, gt=0)
    ignore_eos: Optional[bool] = False
    stop_token_ids: Optional[list[int]] = None
    guided_json: Optional[Union[dict, str]] = None  # a JSON schema (object or JSON text)
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None  # EBNF (xgrammar's GBNF dialect, a `root` rule)
    # speculative decoding of this request (moe-lab's extension): "off", a method the server can run
    # ("ngram", "self", "mtp", "draft" with the server's draft model) or {"method": ..., options};
    # None: the server's --speculative
    speculative: Optional[Union[str, dict]] = None

    @field_validator("n", "stream", "ignore_eos", mode="after")
    @classmethod
    def _null_is_default(cls, v, info):  # some clients send null for "not set"
        if v is None:
            return 1 if info.field_name == "n" else False
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if v is None:
            return v
        stops = [v] if isinstance(v, str) else v
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences")
        if not all(stops):
            raise ValueError("stop sequences must be non-empty strings")
        return stops or None

    def guided_spec(self) -> tuple[Optional[dict], Optional[str]]:
        """The structured-output request as (`moe.engine.GuidedParams` fields, the request field
        it came from), or (None, None); a 400 if more than one is given."""
        given = [(f"guided_{k}", k, v) for k in ("json", "regex", "choice", "grammar")
                 if (v := getattr(self, f"guided_{k}")) is not None]
        if len(given) > 1:
            raise bad_request(f"give at most one of {[g[0] for g in given]}", param=given[1][0])
        return ({given[0][1]: given[0][2]}, given[0][0]) if given else (None, None)

    def check_unsupported(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise bad_request(f"{name} is not supported by this server (use repetition_penalty)", param=name)
        if self.logit_bias:
            raise bad_request("logit_bias is not supported by this server", param="logit_bias")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: Optional[str] = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: Optional[Union[str, list[ContentPart]]] = None
    name: Optional[str] = None

    def as_template_message(self, i: int) -> dict:
        role = "system" if self.role == "developer" else self.role
        content = self.content
        if isinstance(content, list):
            if any(p.type != "text" or p.text is None for p in content):
                raise bad_request(f"messages[{i}].content: only text parts are supported",
                                  param=f"messages.{i}.content")
            content = "".join(p.text for p in content)
        if content is None:
            if self.role != "assistant":
                raise bad_request(f"messages[{i}].content is required", param=f"messages.{i}.content")
            content = ""
        return {"role": role, "content": content}


class JsonSchemaFormat(BaseModel):
    """OpenAI's `response_format.json_schema`: the schema is enforced whether `strict` is set or
    not (grammar-constrained decoding has no "best effort" mode)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: Optional[str] = None
    description: Optional[str] = None
    schema_: dict = Field(..., alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Optional[list[Any]] = None
    response_format: Optional[ResponseFormat] = None

    def guided_spec(self) -> tuple[Optional[dict], Optional[str]]:
        """`response_format` (json_object, json_schema) or one `guided_*` field, not both."""
        spec, field = super().guided_spec()
        rf = self.response_format
        if rf is None or rf.type == "text":
            return spec, field
        if spec is not None:
            raise bad_request(f"give either response_format or {field}, not both", param=field)
        if rf.type == "json_object":
            return {"json_object": True}, "response_format"
        if rf.json_schema is None:
            raise bad_request("response_format.json_schema is required with type 'json_schema'",
                              param="response_format.json_schema")
        return {"json": rf.json_schema.schema_}, "response_format"

    def check_unsupported(self) -> None:
        super().check_unsupported()
        if self.tools:
            raise bad_request("tools are not supported by this server", param="tools")
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs=true", param="top_logprobs")


PromptType = Union[str, list[str], list[int], list[list[int]]]


class CompletionRequest(_Request):
    prompt: PromptType
    max_tokens: Optional[int] = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: Optional[bool] = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    def check_unsupported(self) -> None:
        super().check_unsupported()
        if self.echo:
            raise bad_request("echo is not supported by this server", param="echo")
        if self.suffix:
            raise bad_request("suffix is not supported by this server", param="suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise bad_request("best_of other than n is not supported by this server", param="best_of")

    def prompts(self) -> list[Union[str, list[int]]]:
        """The prompt(s) as a list of strings or token-id lists."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise bad_request("prompt must not be empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class TokenizeRequest(BaseModel):
    """vLLM's `/tokenize`: a `prompt`, or chat `messages` rendered with the chat template."""

    model_config = ConfigDict(extra="ignore")
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[ChatMessage]] = None


_Request.model_rebuild()
ChatCompletionRequest.model_rebuild()
CompletionRequest.model_rebuild()
