"""The OpenAI-compatible HTTP API and Prometheus metrics, served as a client of the engine.

Everything here runs in the HTTP server's process and talks to the engine only through an
EngineClient (docs/engine-client-api.md): the engine process's GIL belongs to its step loop
(docs/design.md §5), so no HTTP parsing, tokenizing for chat templates or metric building ever
runs there. Never imports streamlit or ui/.

    schema.py      request validation and response shapes (OpenAI's field names)
    prompts.py     prompt / chat messages -> token ids and SamplingParams, length checks
    bridge.py      one request's blocking EngineClient stream -> asyncio
    prometheus.py  /metrics: vLLM's metric names where the meaning is the same, gapless:* ours
    app.py         the FastAPI app (routes, errors, auth) around a client object
    serve.py       `python -m engine serve`
"""
