"""The request ledger on a real engine's telemetry (tiny Llama, CPU): joined to the steps each
request rode, with its cached prompt tokens, finish reason and device-time share."""

from __future__ import annotations

import pytest
from engine_checks import TIGHT_CUDA

from engine import Engine, EngineConfig, SamplingParams
from telemetry.ledger import build_ledger, slowest_first, window_device_ns

CFG = dict(device="cpu", max_num_seqs=4, max_num_batched_tokens=16, block_size=4,
           num_blocks=64, max_model_len=96)
NEW = 6


@pytest.mark.parametrize("async_batching", [False, True])
def test_ledger_of_a_cached_request_and_an_aborted_one(tiny_model_dir, async_batching):
    prefix = list(range(10, 42))  # 32 tokens: 8 full blocks
    params = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
    cfg = EngineConfig(model=str(tiny_model_dir("llama")), async_batching=async_batching,
                       **CFG)
    with Engine(cfg, start=False) as eng:
        first = eng.submit(prefix + [7, 8, 9], params)
        while not first.done:
            eng.step()
        second = eng.submit(prefix + [5, 6], params)
        doomed = eng.submit(list(range(100, 140)), SamplingParams(max_tokens=50,
                                                                  ignore_eos=True))
        eng.step()
        eng.abort(doomed.request_id)
        while not (second.done and doomed.done):
            eng.step()
        records = eng.bus.snapshot_steps(10_000)
        events = eng.bus.snapshot_events(10_000)
        per_token = eng.settings()["kv_bytes_per_token"]
    assert per_token > 0
    ledger = build_ledger(records, events, per_token)
    a, b, c = (ledger[h.request_id] for h in (first, second, doomed))
    out_b = second.result()
    assert out_b.num_cached_tokens > 0
    assert b.cached_tokens == out_b.num_cached_tokens and a.cached_tokens == 0
    assert (a.finish_reason, b.finish_reason, c.finish_reason) == ("length", "length", "abort")
    assert a.output_tokens == b.output_tokens == NEW
    # 35 prompt tokens in 16-token chunks: 3 prefill steps; then NEW - 1 decodes.
    assert len(a.prefill_steps) == 3 and len(a.decode_steps) == NEW - 1
    # Its cached prefix is not recomputed: 34 - 32 = 2 tokens, one prefill step.
    assert len(b.prefill_steps) == 1
    assert b.kv_bytes_read >= (len(prefix) + 2) * per_token
    assert b.queue_s is not None and b.queue_s >= 0 and b.e2e_s >= b.queue_s
    assert all(e.device_ns > 0 for e in (a, b))
    shares = sum(e.device_ns for e in ledger.values())
    assert abs(shares - window_device_ns(r for r in records if r.chunks)) < 1e-3
    order = [e.e2e_s for e in slowest_first(ledger.values())]
    assert len(order) == 3 and order == sorted(order, reverse=True)


@pytest.mark.cuda
def test_ledger_on_the_gpu_with_cuda_graphs(tiny_model_dir):
    """Compute spans from CUDA events (graphs, async): every request's share is positive and
    the shares of the window add up to its device time."""
    prefix = list(range(10, 74))
    prompts = [prefix + [i, i + 1] for i in range(1, 9)]
    cfg = EngineConfig(model=str(tiny_model_dir("llama")), **{**TIGHT_CUDA,
                                                               "async_batching": True})
    with Engine(cfg) as eng:
        outs = eng.generate(prompts, SamplingParams(max_tokens=NEW, temperature=0.0,
                                                    ignore_eos=True))
        assert eng.settings()["cuda_graphs"]
        records = eng.bus.snapshot_steps(10_000)
        events = eng.bus.snapshot_events(10_000)
        per_token = eng.settings()["kv_bytes_per_token"]
    ledger = build_ledger(records, events, per_token)
    mine = [ledger[o.request_id] for o in outs]
    assert all(e.finish_reason == "length" and e.device_ns > 0 for e in mine)
    assert sum(e.cached_tokens for e in mine) == sum(o.num_cached_tokens for o in outs) > 0
    shares = sum(e.device_ns for e in ledger.values())
    assert abs(shares - window_device_ns(r for r in records if r.chunks)) < 1e-3
