"""The OpenAI-compatible HTTP API around one engine client: routes, errors, auth, streaming.

Owns the FastAPI app: POST /v1/completions and /v1/chat/completions (streamed as
server-sent events ending in ``data: [DONE]``, or not), GET /v1/models, /health and
/metrics. ``create_app`` takes any object with EngineClient's methods (submit, stream,
result, abort, settings, stats, telemetry, alive, death_reason), so the same app serves an
engine this process started or one it attached to.

Errors use OpenAI's shape {"error": {"message", "type", "param", "code"}}: bad input 400,
a wrong API key 401, an unknown model 404 (as OpenAI and vLLM answer), a slow body 408, a
big one 413, a dead engine 503, a server at its limit of requests in flight 503 with
Retry-After, and an engine silent past the client's give_up_after_s (serve
--engine-timeout) 503 too, its requests aborted (a stream ends with an error event and
[DONE]). docs/serving.md says what a client sees in each case.
A client that goes away before its answer is complete gets its request aborted, so its KV
blocks come back at once. It must never wait on the engine on the event loop thread
(bridge.py says how a request crosses to it) and never run in the engine process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from engine.core.request import RequestOutput
from engine.process.client import EngineDead, EngineError, EngineNotResponding
from engine.serving import limits, schema
from engine.serving.bridge import EngineRequest
from engine.serving.ledger_route import ledger_router
from engine.serving.model_names import accepted_names, served_names
from engine.serving.prometheus import CONTENT_TYPE, EngineMetrics
from engine.serving.prompts import PromptBuilder
from engine.serving.protocol import SSE_SCOPE_KEY
from engine.serving.schema import ApiError, ChatCompletionRequest, CompletionRequest

log = logging.getLogger("gapless.http")

DONE = "data: [DONE]\n\n"
PARSE_ON_LOOP_BYTES = 64 * 1024  # bodies up to this size are decoded on the event loop
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# (engine request, model name, created, the request) -> the SSE events of a streamed answer
StreamEvents = Callable[[EngineRequest, str, int, Any], AsyncIterator[str]]


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, separators=(',', ':'), ensure_ascii=False)}\n\n"


def usage_options(req: Any) -> tuple[bool, bool]:
    """(usage chunk at the end, usage on every chunk) as stream_options asks: vLLM honours
    continuous_usage_stats only together with include_usage."""
    opts = req.stream_options
    with_usage = opts is not None and opts.include_usage
    return with_usage, with_usage and opts.continuous_usage_stats


def engine_failure(e: BaseException) -> ApiError:
    """The answer for an exception from an engine call."""
    if isinstance(e, ValueError):  # the engine's own message about the input
        return ApiError(400, str(e))
    if isinstance(e, EngineDead):
        return ApiError(503, f"the engine is not running: {e.reason}", type="server_error",
                        code="engine_dead")
    if isinstance(e, EngineNotResponding):  # its message speaks to Python callers
        return ApiError(503, f"the engine has sent nothing for {e.silent_s:.1f} s: it is hung "
                             "or stopped; the request was aborted", type="server_error",
                        code="engine_timeout")
    if isinstance(e, TimeoutError):
        return ApiError(503, f"the engine did not answer in time: {e}; the request was "
                             "aborted", type="server_error", code="engine_timeout")
    return ApiError(500, f"the engine failed: {type(e).__name__}: {e}", type="server_error")


def output_failure(out: RequestOutput, client: Any) -> ApiError | None:
    """An ApiError for a request that ended in error (engine death, a failed step)."""
    if out.finish_reason != "error":
        return None
    if not client.alive():
        return ApiError(503, f"the engine is not running: {client.death_reason()}",
                        type="server_error", code="engine_dead")
    return ApiError(500, f"the request failed in the engine: {out.error}", type="server_error")


class EventStream(StreamingResponse):
    """Server-sent events that stop, and run ``on_close``, the moment the client leaves.

    Starlette notices a disconnect only when a write fails on newer ASGI servers; a request
    still queued behind others writes nothing, so the disconnect is listened for here.
    """

    def __init__(self, content: AsyncIterator[str],
                 on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[SSE_SCOPE_KEY] = True  # the connection may probe it with a comment
        try:
            async with anyio.create_task_group() as tg:
                async def write() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client is gone
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(write)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            await self.on_close()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_done(request: Request, er: EngineRequest) -> RequestOutput | None:
    """The request's output, or None (after aborting it) if the client left first."""
    result = asyncio.ensure_future(er.result())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not result.done():
            result.cancel()
            await er.abort()
    if not result.done() or result.cancelled():
        return None
    e = result.exception()
    if isinstance(e, (TimeoutError, EngineDead, EngineError)):  # silent past --engine-timeout
        await er.abort()  # applied when the engine answers again: nothing runs unseen
        raise engine_failure(e)
    return result.result()


def create_app(client: Any, *, tokenizer: Any,
               served_model_name: str | Sequence[str] | None = None,
               api_key: str | None = None, metrics_period_s: float = 0.25,
               bounds: limits.Bounds | None = None) -> FastAPI:
    """The app for one client. Reads client.settings() once, here (model and
    max_model_len); /metrics polls the client on a thread while the app runs.
    ``served_model_name``: one alias or several (model_names.py says the default).
    ``bounds``: body size and time, tokenization in flight (limits.py).
    ``app.state.engine_note``: set by whoever restarts the engine (serve.py), said by
    /health and /ready while the engine is not alive."""
    settings = client.settings()
    names = served_names(settings["model"], served_model_name)
    model = names[0]  # answers in responses and labels the metrics, as in vLLM
    accepted = accepted_names(settings["model"], names)
    max_model_len = int(settings["max_model_len"])
    prompts = PromptBuilder(tokenizer, max_model_len)
    bounds = bounds or limits.Bounds()
    tokenizing = limits.WorkGate("tokenizations", bounds.max_tokenizing,
                                 bounds.max_tokenize_waiting_chars)
    inflight = limits.InflightLimit(bounds.max_inflight)
    chat_overhead = prompts.chat_overhead_chars()
    metrics = EngineMetrics(client, model, metrics_period_s, max_model_len=max_model_len)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(metrics.poll)  # the first scrape already has the gauges
        metrics.start()
        try:
            yield
        finally:
            metrics.stop()

    app = FastAPI(title="gapless", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.metrics = metrics
    app.state.served_model_names = names
    app.state.engine_note = None

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        headers = dict(e.headers or {})
        if e.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        if e.status in (408, 413):  # the body may be unread: the connection cannot go on
            headers["Connection"] = "close"
        return JSONResponse(e.body(), status_code=e.status, headers=headers or None)

    @app.exception_handler(limits.ClientGone)
    async def client_gone(request: Request, e: limits.ClientGone) -> Response:
        log.warning("%s %s: %s", request.method, request.url.path, e)
        return Response(status_code=499)  # nobody is listening

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(schema.error_body(str(e.detail)), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def server_error(request: Request, e: Exception) -> JSONResponse:
        return JSONResponse(schema.error_body(f"internal error: {type(e).__name__}: {e}",
                                              "server_error"), status_code=500)

    async def check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(
                token.strip().encode(), api_key.encode()):
            raise ApiError(401, "missing or wrong API key: send the header "
                                "'Authorization: Bearer <key>' with the key the server was "
                                "started with", code="invalid_api_key")

    def check_model(name: str | None) -> None:
        if name is not None and name not in accepted:
            served = ", ".join(repr(n) for n in names)
            raise ApiError(404, f"the model {schema.shown(name)} does not exist; this server "
                                f"serves {served} (see GET /v1/models)", param="model",
                           code="model_not_found")

    async def submit(ids: list[int], req: Any, prefix: str) -> EngineRequest:
        params = prompts.sampling(req, len(ids))
        rid = f"{prefix}-{uuid.uuid4().hex[:24]}"
        try:
            return await EngineRequest.submit(client, ids, params, rid)
        except (ValueError, EngineDead, TimeoutError, EngineError) as e:
            raise engine_failure(e) from None

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])

    @v1.get("/models")
    async def list_models() -> dict[str, Any]:
        return schema.models_body(names, settings["model"], max_model_len, schema.now_s())

    async def answer(request: Request, req: CompletionRequest | ChatCompletionRequest,
                     tokenize: Callable[[], Awaitable[list[int]]], prefix: str,
                     events: StreamEvents, body: Callable[..., dict[str, Any]]) -> Response:
        """Take a slot among the requests in flight (503 when none is free), tokenize and
        submit the prompt, then stream its events or answer with ``body`` once it is done.
        The slot is freed when the answer ends, however it ends."""
        free = inflight.take()
        try:
            er = await submit(await tokenize(), req, prefix)
        except BaseException:
            free()
            raise
        created = schema.now_s()
        if req.stream:
            async def closed() -> None:
                try:
                    await er.abort()
                finally:
                    free()
            return EventStream(events(er, model, created, req), closed)
        try:
            out = await until_done(request, er)
        finally:
            free()
        if out is None:
            return Response(status_code=499)  # nobody is listening
        failure = output_failure(out, client)
        if failure is not None:
            raise failure
        return JSONResponse(body(
            er.request_id, model, created, out.text, out.finish_reason,
            schema.usage(er.prompt_len, len(out.token_ids), out.num_cached_tokens)))

    async def reply_events(er: EngineRequest, text_chunk: Callable[[str], str],
                           finish_chunk: Callable[[str | None], str],
                           usage_chunk: Callable[[dict[str, int]], str] | None
                           ) -> AsyncIterator[str]:
        """A streamed reply's events after any opening one: a chunk per text delta, then the
        finish chunk (or the failure), the usage chunk when one is asked for, and [DONE]."""
        try:
            async for text in er.deltas():
                yield text_chunk(text)
        except (TimeoutError, EngineDead, EngineError) as e:  # silent past --engine-timeout
            await er.abort()  # applied when the engine answers again
            yield sse(engine_failure(e).body())
            yield DONE
            return
        out = er.output
        assert out is not None
        failure = output_failure(out, client)
        if failure is not None:
            yield sse(failure.body())
        else:
            yield finish_chunk(out.finish_reason)
            if usage_chunk is not None:
                yield usage_chunk(schema.usage(er.prompt_len, len(out.token_ids),
                                               out.num_cached_tokens))
        yield DONE

    def check_shape(data: dict[str, Any]) -> None:
        limits.check_shape(data, max_model_len)

    parsing = anyio.CapacityLimiter(1)

    async def parse(request: Request, model_type: Any) -> tuple[Any, int]:
        """The request and its prompt's characters, refused (413/400) on its size, nesting,
        arrays or prompt characters before it is validated or tokenized. A large body is
        decoded on a worker thread, one at a time: the loop answers /health and writes
        streams between two of them, never waits behind a queue of them."""
        raw = await limits.read_body(request, bounds.max_body_bytes, bounds.body_timeout_s)
        limits.check_commas(raw, max_model_len)
        if len(raw) <= PARSE_ON_LOOP_BYTES:
            req = schema.parse_request(raw, model_type, check_shape)
        else:
            req = await anyio.to_thread.run_sync(schema.parse_request, raw, model_type,
                                                 check_shape, limiter=parsing)
        chars = limits.prompt_chars(req, chat_overhead)
        limits.check_prompt_chars(chars, max_model_len)
        return req, chars

    @v1.post("/completions")
    async def completions(request: Request) -> Response:
        req, chars = await parse(request, CompletionRequest)
        check_model(req.model)

        def tokenize() -> Awaitable[list[int]]:
            return tokenizing.run(prompts.completion_ids, req, cost=chars + 1)
        return await answer(request, req, tokenize, "cmpl", _completion_events,
                            schema.completion_body)

    def _completion_events(er: EngineRequest, name: str, created: int,
                           req: CompletionRequest) -> AsyncIterator[str]:
        with_usage, continuous = usage_options(req)

        def chunk(text: str | None, finish: str | None, use: dict[str, int] | None = None
                  ) -> str:
            body = schema.completion_body(er.request_id, name, created, text, finish, use,
                                          chunk=True)
            if with_usage and use is None:
                # OpenAI: every chunk but the last carries usage: null; vLLM's
                # continuous_usage_stats: each carries the usage so far instead.
                body["usage"] = schema.usage(er.prompt_len, er.num_tokens) if continuous \
                    else None
            return sse(body)

        return reply_events(er, lambda text: chunk(text, None), lambda finish: chunk("", finish),
                            (lambda use: chunk(None, None, use)) if with_usage else None)

    @v1.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req, chars = await parse(request, ChatCompletionRequest)
        check_model(req.model)

        def tokenize() -> Awaitable[list[int]]:
            return tokenizing.run(prompts.chat_ids, req, model, cost=chars + 1)
        return await answer(request, req, tokenize, "chatcmpl", _chat_events, schema.chat_body)

    async def _chat_events(er: EngineRequest, name: str, created: int,
                           req: ChatCompletionRequest) -> AsyncIterator[str]:
        with_usage, continuous = usage_options(req)

        def chunk(delta: dict[str, Any] | None, finish: str | None = None,
                  use: dict[str, int] | None = None) -> str:
            if use is None and continuous:
                use = schema.usage(er.prompt_len, er.num_tokens)
            body = schema.chat_chunk(er.request_id, name, created, delta, finish, use)
            return sse({**body, "usage": None} if use is None and with_usage else body)

        yield chunk({"role": "assistant", "content": ""})
        async for event in reply_events(
                er, lambda text: chunk({"content": text}), lambda finish: chunk({}, finish),
                (lambda use: chunk(None, use=use)) if with_usage else None):
            yield event

    v1.include_router(ledger_router(client))  # GET /v1/requests/{id}/ledger
    app.include_router(v1)

    def engine_state() -> tuple[str, str | None]:
        status = getattr(client, "status", None)
        if status is None:  # a client without liveness states: alive or dead
            return ("alive", None) if client.alive() else ("dead", client.death_reason())
        st = status()
        return st.state, getattr(st, "reason", None)

    @app.get("/health")
    async def health() -> JSONResponse:
        """Liveness of the engine: 200 while it answers (alive, or stalled on a long step),
        503 with the reason while it is hung (not responding) or dead."""
        state, reason = engine_state()
        if state in ("alive", "stalled"):
            return JSONResponse({"status": "ok"})
        code = "engine_dead" if state == "dead" else "engine_not_responding"
        what = "is not running" if state == "dead" else "is not responding"
        note = f" ({app.state.engine_note})" if app.state.engine_note else ""
        raise ApiError(503, f"the engine {what}: {reason}{note}", type="server_error",
                       code=code)

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness: 200 only while the engine is alive and not stalled, so a load balancer
        sends new requests elsewhere meanwhile."""
        state, reason = engine_state()
        if state == "alive":
            return JSONResponse({"status": "ready"})
        note = f" ({app.state.engine_note})" if app.state.engine_note else ""
        raise ApiError(503, f"the engine is not ready ({state}): {reason}{note}",
                       type="server_error", code=f"engine_{state}")

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        # Bytes the poll thread rendered: answered on the loop, never queued behind the
        # thread pool that a burst of submits fills.
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app
