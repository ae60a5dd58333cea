"""How many tokens a request produced, even when its result was cut short.

When the engine dies mid-reply the client ends the request with finish_reason "error" and
an empty ``token_ids`` (the dead engine cannot say), so a page would report "0 tokens" under
text it has shown. The telemetry bus mirrored every "first_token"/"tokens" event of the
request before the death: ``tokens_emitted`` counts them. Pure function over events: no
streamlit, no engine.
"""

from __future__ import annotations

from collections.abc import Iterable

from telemetry.records import RequestEvent


def tokens_emitted(events: Iterable[RequestEvent], request_id: str) -> int:
    """Tokens the engine reported emitting for ``request_id`` (its token events)."""
    return sum(
        e.num_tokens
        for e in events
        if e.request_id == request_id and e.kind in ("first_token", "tokens")
    )


def reply_tokens(token_ids: list[int], events: Iterable[RequestEvent], request_id: str) -> int:
    """The reply's token count: the result's own, or what telemetry saw when it is short."""
    return max(len(token_ids), tokens_emitted(events, request_id))
