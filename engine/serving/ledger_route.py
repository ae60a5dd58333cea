"""GET /v1/requests/{id}/ledger: what one request cost, joined to the engine steps it rode.

Owns the route and its answer's shape: telemetry.ledger's entry for the request (queue time,
prefill and decode step ids, its token share of those steps' device time, KV bytes read,
cached prompt tokens, preemptions, finish reason), read from the client's local telemetry
mirror. The id is the ``id`` of a completion this server answered (or any engine request id).
An id the mirror does not hold answers 404 in OpenAI's error shape; so does every id while
the engine's telemetry is off.

It must never call the engine from the event loop thread (it reads the local mirror on a
worker thread) and never keep its own copy of the telemetry.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from engine.serving.schema import ApiError
from telemetry.ledger import request_ledger

# The mirror's rings hold fewer than this: every step and event it still has.
ALL = 1 << 20


def ledger_body(client: Any, request_id: str, kv_bytes_per_token: int) -> dict[str, Any]:
    bus = client.telemetry()
    records = bus.snapshot_steps(ALL)
    entry = request_ledger(records, bus.snapshot_events(ALL), request_id, kv_bytes_per_token)
    if entry is None:
        raise ApiError(404, f"no request {request_id!r} in the engine's telemetry: it holds the "
                            f"newest {len(records):,} steps and their requests; ask with the "
                            "'id' of a completion", param="request_id",
                       code="request_not_found")
    return {"object": "request.ledger", **entry.to_dict()}


def ledger_router(client: Any) -> APIRouter:
    """The route, to include in the /v1 router (which checks the API key)."""
    router = APIRouter()
    settings = client.settings()
    telemetry_on = bool(settings.get("telemetry", True))
    per_token = int(settings.get("kv_bytes_per_token", 0))

    @router.get("/requests/{request_id}/ledger")
    async def request_ledger_route(request_id: str) -> dict[str, Any]:
        if not telemetry_on:
            raise ApiError(404, "the engine runs with telemetry off: no request ledger "
                                "(start it with telemetry: true)", param="request_id",
                           code="telemetry_off")
        return await run_in_threadpool(ledger_body, client, request_id, per_token)

    return router
