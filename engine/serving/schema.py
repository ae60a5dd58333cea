"""OpenAI request validation and response shapes for /v1/completions and /v1/chat/completions.

Owns the wire format only: which fields a request may carry and with which types (pydantic,
strict: "5" is not an int, 1 is not a bool), which fields we refuse because they would be
silently ignored (n > 1, logprobs, penalties...), and the JSON bodies of answers, stream
chunks and errors. It must never talk to the engine or tokenize anything.

Unknown fields are ignored, as vLLM does: clients send extras such as `user`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# The parser's nesting limit (pydantic-core's JSON parser refuses deeper input without
# recursing in Python); OpenAI's request shapes nest fewer than 10 levels.
MAX_JSON_DEPTH = 200


class ApiError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers  # sent with the answer (Retry-After on a 503 for a busy server)

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# ----------------------------------------------------------------------------- requests
class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, usage on every chunk


class _Sampling(_Strict):
    """Fields shared by both endpoints. None means "not given": the default applies."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # vLLM's extension
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False  # vLLM's extension (benchmarks: exactly max_tokens tokens)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Refused unless left at their defaults: we would otherwise ignore them silently.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, why) for each field given a value this server does not honour."""
        out = []
        if self.n != 1:
            out.append(("n", f"n must be 1 (one choice per request), got {self.n}"))
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value not in (None, 0, 0.0):
                out.append((name, f"{name} is not supported (leave it out or 0), got {value}"))
        if self.logit_bias:
            out.append(("logit_bias", "logit_bias is not supported"))
        if self.stream_options is not None and not self.stream:
            out.append(("stream_options", "stream_options is only allowed with stream=true"))
        return out


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.echo:
            out.append(("echo", "echo is not supported"))
        if self.logprobs is not None:
            out.append(("logprobs", "logprobs is not supported"))
        if self.best_of not in (None, 1):
            out.append(("best_of", f"best_of must be 1, got {self.best_of}"))
        if self.suffix:
            out.append(("suffix", "suffix is not supported"))
        return out


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    model_config = ConfigDict(strict=True, extra="allow")  # name, tool_call_id... pass on
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.logprobs or self.top_logprobs is not None:
            out.append(("logprobs", "logprobs is not supported"))
        if self.tools:
            out.append(("tools", "tools are not supported"))
        if self.response_format and self.response_format.get("type") != "text":
            out.append(("response_format", "only response_format {\"type\": \"text\"} is "
                                           "supported"))
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            out.append(("max_tokens", "give max_tokens or max_completion_tokens, not both"))
        return out

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens


def decode_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or ApiError(400). Decoded by pydantic's parser (no Python
    recursion: nesting past its limit is refused, not a RecursionError)."""
    from pydantic_core import from_json

    try:
        data = from_json(raw)
    except ValueError as e:
        if "recursion limit" in str(e):
            raise ApiError(400, f"the request body nests JSON deeper than {MAX_JSON_DEPTH} "
                                "levels; OpenAI's request shapes need far fewer",
                           code="json_too_deep") from None
        raise ApiError(400, f"the request body is not valid JSON ({e}); send a JSON object "
                            "with Content-Type: application/json") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def parse_request(raw: bytes, model: type[_Sampling],
                  check: Callable[[dict[str, Any]], None] | None = None) -> Any:
    """The validated request, or ApiError(400) naming the first bad field and why. ``check``
    sees the decoded body before it is validated (limits.check_shape)."""
    data = decode_json(raw)
    refused: ApiError | None = None
    try:
        if check is not None:
            check(data)
        req = model.model_validate(data)
    except ApiError as e:
        refused = e
    except ValidationError as e:
        message, param = _describe(e.errors(include_url=False)[0])
        refused = ApiError(400, message, param=param)
    if refused is not None:
        # Freed here, on this thread: a traceback would keep the decoded body alive until
        # the error is handled, and a big one would then be freed on the event loop.
        del data
        raise refused.with_traceback(None) from None
    bad = req.unsupported()
    if bad:
        field, why = bad[0]
        raise ApiError(400, why, param=field)
    return req


def shown(value: Any, limit: int = 200) -> str:
    """repr(value) cut to ``limit`` characters: what an error message quotes of an input."""
    text = repr(value) if not isinstance(value, (list, dict)) or len(value) < limit \
        else f"<{type(value).__name__} of {len(value)} items>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


# What a field that takes one of several shapes allows (pydantic names each member instead).
_UNIONS = {
    "prompt": "a non-empty string or a list of token ids (one prompt per request)",
    "stop": "a string or a list of strings",
    "content": 'a string or a list of text parts ({"type": "text", "text": "..."})',
}
_SCALARS = {"str", "int", "float", "bool", "none"}


def _describe(err: Any) -> tuple[str, str | None]:
    """(message, param) for pydantic's first error, naming the field and what it allows."""
    loc = list(err["loc"])
    # Union members appear in loc as their type ("str", "list[int]"): drop them.
    clean = [p for p in loc if not (isinstance(p, str) and (p in _SCALARS or "[" in p))]
    path = ".".join(str(p) for p in clean) or "body"
    given = f"; got {shown(err['input'])}" if "input" in err and err["type"] != "missing" else ""
    if err["type"] == "missing":
        return f"{path} is required", path
    field = next((p for p in reversed(clean) if isinstance(p, str)), "")
    if clean != loc and field in _UNIONS:
        return f"{path} must be {_UNIONS[field]}{given}", path
    return f"{path}: {err['msg'][0].lower()}{err['msg'][1:]}{given}", path


# ---------------------------------------------------------------------------- responses
def usage(prompt_tokens: int, completion_tokens: int,
          cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage; with cached_tokens (a finished request's prompt tokens found in the
    prefix cache) also `prompt_tokens_details.cached_tokens`, as OpenAI and vLLM report it."""
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def completion_body(rid: str, model: str, created: int, text: str | None,
                    finish_reason: str | None, use: dict[str, int] | None,
                    chunk: bool = False) -> dict[str, Any]:
    """A /v1/completions answer, or one of its stream chunks (text None: the usage chunk)."""
    choices = [] if text is None else [
        {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]
    body: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created,
                            "model": model, "choices": choices}
    if not chunk or use is not None:
        body["usage"] = use
    return body


def chat_body(rid: str, model: str, created: int, text: str, finish_reason: str | None,
              use: dict[str, int]) -> dict[str, Any]:
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": None, "finish_reason": finish_reason}],
        "usage": use,
    }


def chat_chunk(rid: str, model: str, created: int, delta: dict[str, Any] | None,
               finish_reason: str | None = None,
               use: dict[str, int] | None = None) -> dict[str, Any]:
    """One chat stream chunk; delta None makes the final usage-only chunk (no choices)."""
    choices = [] if delta is None else [
        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    body: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created,
                            "model": model, "choices": choices}
    if use is not None:
        body["usage"] = use
    return body


def models_body(names: list[str], root: str, max_model_len: int, created: int
                ) -> dict[str, Any]:
    """GET /v1/models: one entry per served name (alias), each rooted at the model."""
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": created, "owned_by": "gapless",
         "root": root, "parent": None, "max_model_len": max_model_len} for name in names]}


def now_s() -> int:
    return int(time.time())
