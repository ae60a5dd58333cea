"""Bounds a request meets before any work is spent on it: body bytes, the shape of its JSON,
prompt characters, and requests in flight.

Owns the cheap checks that run before validation and tokenization: a declared
Content-Length over the limit is refused before a byte of the body is read (413), a body that
grows past the limit while it is read is refused at that point (the server never holds more
than ``max_body_bytes`` of one request), a body that has not all arrived in time is refused
(408), and a client that leaves while its body arrives ends the request with one log line.
A body with more commas than any request this server accepts could hold is refused before
it is decoded (decoding millions of values would hold the interpreter for tens of
milliseconds). Once the body is decoded (JSON nested past the parser's limit is a 400), its
arrays are
bounded before the request is validated: one prompt a request, at most ``max_model_len - 1``
token ids, at most ``max_model_len`` messages and content parts, at most
``MAX_STOP_STRINGS`` stop strings of at most ``MAX_STOP_CHARS`` characters. A prompt is then
refused on the characters that would be tokenized (every string of a list prompt, every
message with what the chat template writes around it) before it is tokenized: a token is at
least one character, so more characters than ``max_model_len`` times a generous factor can
never fit. Every refusal is an ApiError in OpenAI's error shape. It must never tokenize,
call the engine or import the engine process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.config import MAX_STOP_CHARS, MAX_STOP_STRINGS
from engine.serving.schema import ApiError

MAX_BODY_BYTES = 4 * 1024 * 1024  # default body limit (the --max-body-bytes flag)
# A prompt of more than this many characters per token of max_model_len cannot fit: real
# tokenizers average 3-5 characters a token; 32 leaves room for long runs of whitespace.
CHARS_PER_TOKEN_BOUND = 32
BODY_TIMEOUT_S = 30.0  # default --body-timeout: the whole body, after its headers
MAX_TOKENIZING = 4  # prompts tokenized at once, on threads (default --max-tokenizing)
# Prompt characters that may wait for a tokenizer thread before 503s: a burst of short
# prompts (128 streams at once) queues, a pile of long ones does not.
MAX_TOKENIZE_WAITING_CHARS = 16 * 2**20
# Requests between their submit and the end of their answer (default --max-inflight): each
# holds little (its stream's text), and the engine queues what it cannot run yet.
MAX_INFLIGHT = 4096
RETRY_AFTER_S = 1  # what a 503 for a busy server tells the client to wait


@dataclass(frozen=True, slots=True)
class Bounds:
    """The server's per-request bounds (serve's flags)."""

    max_body_bytes: int = MAX_BODY_BYTES
    body_timeout_s: float = BODY_TIMEOUT_S
    max_tokenizing: int = MAX_TOKENIZING
    max_tokenize_waiting_chars: int = MAX_TOKENIZE_WAITING_CHARS
    max_inflight: int = MAX_INFLIGHT


class ClientGone(Exception):
    """The client closed its connection before its request's body had all arrived."""


def declared_length(headers: Any, max_body_bytes: int) -> int | None:
    """The declared Content-Length (None if absent); ApiError 413 over the limit, 400 when it
    is not a number or conflicts with Transfer-Encoding (request smuggling's shape)."""
    raw = headers.get("content-length")
    if raw is None:
        return None
    if headers.get("transfer-encoding") is not None:
        raise ApiError(400, "the request has both Content-Length and Transfer-Encoding; "
                            "send one of them", code="conflicting_framing")
    try:
        n = int(raw)
    except ValueError:
        raise ApiError(400, f"Content-Length {raw[:40]!r} is not a number") from None
    if n > max_body_bytes:
        raise ApiError(413, f"the request body declares {n} bytes; this server accepts at "
                            f"most {max_body_bytes} (--max-body-bytes)",
                       code="request_too_large")
    return n


async def read_body(request: Any, max_body_bytes: int,
                    timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The whole body, refused with 413 as soon as it passes ``max_body_bytes`` and with 408
    when it has not all arrived ``timeout_s`` after its headers (a trickling client, or a
    Content-Length that is never sent). ClientGone when the client leaves meanwhile."""
    from starlette.requests import ClientDisconnect

    declared_length(request.headers, max_body_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_body_bytes:
                    raise ApiError(413, f"the request body is larger than {max_body_bytes} "
                                        "bytes, the most this server accepts "
                                        "(--max-body-bytes)", code="request_too_large")
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout_s:g} s "
                            f"({size} bytes came; --body-timeout)",
                       code="request_timeout") from None
    except ClientDisconnect:
        raise ClientGone(f"the client left after sending {size} bytes of the body") from None
    return b"".join(chunks)


# ------------------------------------------------------------------ the body's shape
def max_commas(max_model_len: int) -> int:
    """The most commas a request this server accepts can hold: those of its prompt's text
    (at most ``max_model_len * CHARS_PER_TOKEN_BOUND`` characters), of its token ids or
    messages (at most ``max_model_len`` each), of its stop strings, and room for the rest."""
    return max_model_len * (CHARS_PER_TOKEN_BOUND + 2) + MAX_STOP_STRINGS * MAX_STOP_CHARS \
        + 65536


def check_commas(raw: bytes, max_model_len: int) -> None:
    """ApiError 400 for a body with more commas than any request this server accepts: every
    array item and object member past the first is one, so decoding it would build that many
    values (two million in a 4 MB body) only to refuse them. A count, not a parse: it takes
    a millisecond where decoding takes tens while holding the interpreter."""
    bound = max_commas(max_model_len)
    n = raw.count(b",")
    if n > bound:
        raise ApiError(400, f"the request body holds {n} commas (array items, object members "
                            f"and text); with max_model_len {max_model_len} a request to this "
                            f"server holds at most {bound}", code="request_too_complex")



def _too_many(what: str, n: int, limit: int, why: str, param: str,
              code: str | None = None) -> ApiError:
    return ApiError(400, f"{what}: {n}; this server accepts at most {limit} ({why})",
                    param=param, code=code)


def check_shape(data: dict[str, Any], max_model_len: int) -> None:
    """ApiError 400 for an array that no request of this server may hold, checked on the
    decoded body before it is validated: the count alone decides, nothing is looked at
    item by item but the stop strings (at most MAX_STOP_STRINGS of them)."""
    max_ids = max_model_len - 1
    prompt = data.get("prompt")
    if isinstance(prompt, list) and prompt:
        if isinstance(prompt[0], (str, list)):  # a batch of prompts
            if len(prompt) > 1:
                raise ApiError(400, f"prompt holds {len(prompt)} prompts; this server takes "
                                    "one prompt per request (a string or a list of token ids)",
                               param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, list) and len(prompt) > max_ids:
            raise _too_many("prompt token ids", len(prompt), max_ids,
                            f"a prompt fits max_model_len {max_model_len} less one token",
                            "prompt", "context_length_exceeded")
    messages = data.get("messages")
    if isinstance(messages, list):
        if len(messages) > max_model_len:
            raise _too_many("messages", len(messages), max_model_len,
                            f"max_model_len {max_model_len}: every message takes tokens",
                            "messages", "context_length_exceeded")
        parts = sum(len(m["content"]) for m in messages
                    if isinstance(m, dict) and isinstance(m.get("content"), list))
        if parts > max_model_len:
            raise _too_many("content parts in all messages", parts, max_model_len,
                            f"max_model_len {max_model_len}", "messages",
                            "context_length_exceeded")
    stop = data.get("stop")
    if isinstance(stop, list):
        if len(stop) > MAX_STOP_STRINGS:
            raise _too_many("stop strings", len(stop), MAX_STOP_STRINGS,
                            "OpenAI allows 4", "stop")
        longest = max((len(s) for s in stop if isinstance(s, str)), default=0)
        if longest > MAX_STOP_CHARS:
            raise _too_many("characters in a stop string", longest, MAX_STOP_CHARS,
                            "each stop string", "stop")
    elif isinstance(stop, str) and len(stop) > MAX_STOP_CHARS:
        raise _too_many("characters in the stop string", len(stop), MAX_STOP_CHARS,
                        "each stop string", "stop")


# --------------------------------------------------------------------- prompt characters
def check_prompt_chars(chars: int, max_model_len: int) -> None:
    """ApiError 400 when a prompt of ``chars`` characters cannot fit ``max_model_len`` tokens
    whatever the tokenizer: refused before tokenizing it costs seconds and gigabytes."""
    bound = max_model_len * CHARS_PER_TOKEN_BOUND
    if chars > bound:
        raise ApiError(400, f"the prompt has {chars} characters; with max_model_len "
                            f"{max_model_len} this server accepts at most {bound} characters "
                            "(then at most max_model_len tokens)", param="prompt",
                       code="context_length_exceeded")


def prompt_chars(req: Any, chat_overhead: tuple[int, int] = (0, 0)) -> int:
    """The characters that tokenizing the request reads: a completion prompt's (every string
    of a list, one per token id), or a chat's: every message's text, role and extra string
    fields, and what the chat template writes (``chat_overhead``: once, and around each
    message, a message without content included; PromptBuilder.chat_overhead_chars)."""
    prompt = getattr(req, "prompt", None)
    if prompt is not None:
        if isinstance(prompt, str):
            return len(prompt)
        return sum(len(p) if isinstance(p, (str, list)) else 1 for p in prompt)
    once, each = chat_overhead
    total = once
    for m in getattr(req, "messages", None) or ():
        total += each + len(m.role) + len(m.text())
        total += sum(len(v) for v in (m.model_extra or {}).values() if isinstance(v, str))
    return total


# ------------------------------------------------------------------------- work in flight
def busy(message: str) -> ApiError:
    """503 for a server at one of its limits: the client retries after RETRY_AFTER_S."""
    return ApiError(503, f"the server is busy: {message}; retry shortly", type="server_error",
                    code="server_busy", headers={"Retry-After": str(RETRY_AFTER_S)})


class InflightLimit:
    """At most ``limit`` requests between their submit and their answer's end; one more is
    refused at once with 503 and Retry-After, before it is tokenized (its result can never
    be lost: it never reached the engine)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_inflight must be >= 1, got {limit}")
        self.limit = limit
        self.count = 0

    def take(self) -> Callable[[], None]:
        """A slot (ApiError 503 when none is free); call what it returns once, to free it."""
        if self.count >= self.limit:
            raise busy(f"{self.count} requests are in flight, the most it takes "
                       "(--max-inflight)")
        self.count += 1
        freed = False

        def free() -> None:
            nonlocal freed
            if not freed:
                freed = True
                self.count -= 1
        return free


class WorkGate:
    """At most ``limit`` calls at once on worker threads; calls queued behind them may
    together cost at most ``max_waiting_cost`` (prompt characters); one more is refused at
    once with 503 (the server is busy: retry), so a burst of long prompts can neither occupy
    every thread nor queue without end. One call always may wait, whatever its cost."""

    def __init__(self, what: str, limit: int, max_waiting_cost: int) -> None:
        if limit < 1 or max_waiting_cost < 0:
            raise ValueError(f"{what}: limit must be >= 1 and max_waiting_cost >= 0, got "
                             f"{limit}, {max_waiting_cost}")
        self.what = what
        self.limit = limit
        self.max_waiting_cost = max_waiting_cost
        self.waiting = 0
        self.waiting_cost = 0
        self.running = 0
        self._sem = asyncio.Semaphore(limit)

    async def run(self, fn: Any, *args: Any, cost: int = 1) -> Any:
        from starlette.concurrency import run_in_threadpool

        if (self._sem.locked() and self.waiting
                and self.waiting_cost + cost > self.max_waiting_cost):
            raise busy(f"{self.limit} {self.what} run and {self.waiting} wait already "
                       f"({self.waiting_cost} prompt characters)")
        self.waiting += 1
        self.waiting_cost += cost
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
            self.waiting_cost -= cost
        self.running += 1
        try:
            return await run_in_threadpool(fn, *args)
        finally:
            self.running -= 1
            self._sem.release()
