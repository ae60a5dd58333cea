"""The dashboard's view of a `serve` process: a client attached to its engine sees the HTTP
clients' requests in its telemetry (the Live timeline and the Requests page read exactly
this), and detaching leaves the server serving."""

from __future__ import annotations

import time

from serve_process import MODEL

from engine.process.client import EngineClient


def test_an_attached_client_sees_http_requests_on_its_telemetry(server, oai):
    watcher = EngineClient.attach(server.socket)
    try:
        reader = watcher.telemetry().reader(from_now=True)
        out = oai.completions.create(model=MODEL, prompt="def add(a, b):\n", max_tokens=7,
                                     temperature=0.0, extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 7
        events, steps = [], []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            events += reader.events()
            steps += reader.steps()
            if any(e.kind == "finished" for e in events):
                break
            time.sleep(0.1)
        finished = [e for e in events if e.kind == "finished"]
        assert len(finished) == 1, [e.kind for e in events]
        rid = finished[0].request_id
        kinds = [e.kind for e in events if e.request_id == rid]
        assert kinds[0] == "queued" and "first_token" in kinds
        # 7 tokens: one prefill step and six decode steps, on the lanes the timeline draws
        assert sum(s.decode_tokens + (s.prefill_tokens > 0) for s in steps) >= 7
        assert {sp.lane for s in steps for sp in s.spans} >= {"cpu.prepare", "compute"}
        assert watcher.status().state == "alive"
    finally:
        watcher.shutdown()  # detaches: the server's own engine keeps serving
    again = oai.completions.create(model=MODEL, prompt="x = ", max_tokens=3, temperature=0.0,
                                   extra_body={"ignore_eos": True})
    assert again.usage.completion_tokens == 3
