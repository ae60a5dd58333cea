"""Step anatomy through the engine process: the client asks for the next N steps' kernels
while requests run and gets plain data back (per-step timing, families, a Chrome trace)."""

from __future__ import annotations

import json

from engine.process.client import EngineClient

SMALL = dict(device="cpu", max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256,
             block_size=16)


def test_record_anatomy_through_the_client(tiny_model_dir):
    c = EngineClient(None, model=str(tiny_model_dir("llama")), **SMALL)
    try:
        params = dict(max_tokens=40, temperature=0.0, ignore_eos=True)
        rids = [c.submit([3, 4, 5, 6 + i], params) for i in range(2)]
        out = c.record_anatomy(n_steps=3, timeout_s=60)
        results = [c.result(rid, timeout=120) for rid in rids]
    finally:
        c.shutdown()
    assert out["device"] == "cpu" and len(out["steps"]) == 3
    assert all(0 < s["kernel_us"] <= s["span_us"] for s in out["steps"])
    assert out["families"] and json.dumps(out["trace"])
    assert all(len(r.token_ids) == 40 for r in results)


def test_a_recording_waiting_for_steps_blocks_none_of_the_clients_other_commands(
    tiny_model_dir,
):
    """On an idle engine a recording waits for steps; meanwhile the same client's settings
    and toggles are answered at once, and the recording ends once requests run."""
    import threading
    import time

    c = EngineClient(None, model=str(tiny_model_dir("llama")), **SMALL)
    out: dict = {}
    try:
        t = threading.Thread(target=lambda: out.update(r=c.record_anatomy(2, timeout_s=60)))
        t.start()
        time.sleep(0.5)  # the recording is now waiting for the engine's next steps
        t0 = time.monotonic()
        assert c.configure(async_batching=False)["async_batching"] is False
        assert c.settings()["async_batching"] is False
        answered_s = time.monotonic() - t0
        assert t.is_alive(), "the recording should still be waiting for steps"
        c.generate([3, 4, 5], dict(max_tokens=8, temperature=0.0, ignore_eos=True), timeout=60)
        t.join(60)
    finally:
        c.shutdown()
    assert answered_s < 5, answered_s
    assert len(out["r"]["steps"]) == 2
