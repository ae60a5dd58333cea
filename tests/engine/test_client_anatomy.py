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
