"""Bounds a request meets before any work is spent on it: body bytes, JSON nesting, prompt
characters.

Owns the cheap checks that run on the event loop before JSON parsing and tokenization: a
declared Content-Length over the limit is refused before a byte of the body is read (413), a
body that grows past the limit while it is read is refused at that point (the server never
holds more than ``max_body_bytes`` of one request), JSON nested deeper than ``MAX_JSON_DEPTH``
is refused by a linear scan before the parser could recurse (400, not a RecursionError's
500), a body that has not all arrived in time is refused (408), and a prompt is refused
on its character count before it is tokenized (a token is at
least one character, so more characters than ``max_model_len`` times a generous factor can
never fit). Every refusal is an ApiError in OpenAI's error shape. It must never tokenize,
call the engine or import the engine process.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from engine.serving.schema import ApiError

MAX_BODY_BYTES = 4 * 1024 * 1024  # default body limit (the --max-body-bytes flag)
MAX_JSON_DEPTH = 64  # OpenAI's bodies nest < 10 deep (messages -> content parts -> ...)
# A prompt of more than this many characters per token of max_model_len cannot fit: real
# tokenizers average 3-5 characters a token; 32 leaves room for long runs of whitespace.
CHARS_PER_TOKEN_BOUND = 32
BODY_TIMEOUT_S = 30.0  # default --body-timeout: the whole body, after its headers
MAX_TOKENIZING = 4  # prompts tokenized at once, on threads (default --max-tokenizing)
# Prompt characters that may wait for a tokenizer thread before 503s: a burst of short
# prompts (128 streams at once) queues, a pile of long ones does not.
MAX_TOKENIZE_WAITING_CHARS = 16 * 2**20


@dataclass(frozen=True, slots=True)
class Bounds:
    """The server's per-request bounds (serve's flags)."""

    max_body_bytes: int = MAX_BODY_BYTES
    body_timeout_s: float = BODY_TIMEOUT_S
    max_tokenizing: int = MAX_TOKENIZING
    max_tokenize_waiting_chars: int = MAX_TOKENIZE_WAITING_CHARS


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
        raise ApiError(400, f"Content-Length {raw!r} is not a number") from None
    if n > max_body_bytes:
        raise ApiError(413, f"the request body declares {n} bytes; this server accepts at "
                            f"most {max_body_bytes} (--max-body-bytes)",
                       code="request_too_large")
    return n


async def read_body(request: Any, max_body_bytes: int,
                    timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The whole body, refused with 413 as soon as it passes ``max_body_bytes`` and with 408
    when it has not all arrived ``timeout_s`` after its headers (a trickling client, or a
    Content-Length that is never sent)."""
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
    return b"".join(chunks)


def check_json_depth(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> None:
    """ApiError 400 if ``raw`` nests arrays/objects deeper than ``max_depth`` (brackets in
    strings do not count). Linear, no recursion: safe on any input."""
    depth = 0
    in_string = escaped = False
    for b in raw:
        if in_string:
            if escaped:
                escaped = False
            elif b == 0x5C:  # backslash
                escaped = True
            elif b == 0x22:  # quote
                in_string = False
        elif b == 0x22:
            in_string = True
        elif b in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > max_depth:
                raise ApiError(400, f"the request body nests JSON deeper than {max_depth} "
                                    "levels; OpenAI's request shapes need far fewer",
                               code="json_too_deep")
        elif b in (0x5D, 0x7D):
            depth -= 1


def check_prompt_chars(chars: int, max_model_len: int) -> None:
    """ApiError 400 when a prompt of ``chars`` characters cannot fit ``max_model_len`` tokens
    whatever the tokenizer: refused before tokenizing it costs seconds and gigabytes."""
    bound = max_model_len * CHARS_PER_TOKEN_BOUND
    if chars > bound:
        raise ApiError(400, f"the prompt has {chars} characters; with max_model_len "
                            f"{max_model_len} this server accepts at most {bound} characters "
                            "(then at most max_model_len tokens)", param="prompt",
                       code="context_length_exceeded")


def prompt_chars(req: Any) -> int:
    """Characters of a completion prompt or of a chat's message contents (token-id prompts
    count their ids, each at least one token)."""
    prompt = getattr(req, "prompt", None)
    if prompt is not None:
        return len(prompt)
    total = 0
    for m in getattr(req, "messages", None) or ():
        content = m.get("content") if isinstance(m, dict) else getattr(m, "content", None)
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else getattr(part, "text", "")
                total += len(text or "")
    return total


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
            raise ApiError(503, f"the server is busy: {self.limit} {self.what} run and "
                                f"{self.waiting} wait already ({self.waiting_cost} prompt "
                                "characters); retry shortly",
                           type="server_error", code="server_busy")
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
