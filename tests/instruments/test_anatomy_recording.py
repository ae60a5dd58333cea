"""Step anatomy on demand, end to end on a CPU: record_anatomy profiles the next N steps
the engine runs (host-emulated streams), groups each step's ops, writes a Chrome trace, and
leaves the engine serving with the profiler off."""

from __future__ import annotations

import json
import os
import threading

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.instruments.anatomy import anatomy_summary, record_anatomy
from telemetry.anatomy import family_table, group_by_step

CFG = dict(device="cpu", max_num_seqs=4, max_num_batched_tokens=16, block_size=4,
           num_blocks=40, max_model_len=96)


@pytest.mark.parametrize("async_batching", [False, True])
def test_records_the_next_n_steps_while_serving(tiny_model_dir, tmp_path, async_batching):
    eng = Engine(EngineConfig(model=str(tiny_model_dir("llama")), async_batching=async_batching,
                              **CFG))
    try:
        params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
        handles = [eng.submit([3, 4, 5, 6 + i], params) for i in range(4)]
        rec = record_anatomy(eng, 3, timeout_s=60, trace_dir=str(tmp_path))
        for h in handles:
            assert len(h.result(timeout=60).token_ids) == 24  # serving went on
    finally:
        eng.shutdown()
    assert rec.device == "cpu" and rec.n_steps == 3
    assert [s.step for s in rec.steps] == [rec.first_step + k for k in range(3)]
    for s in rec.steps:
        assert s.kernels, f"step {s.step} has no recorded ops"
        assert 0 < s.kernel_us <= s.span_us
    assert any(r.family == "gemm" for r in family_table(rec.steps))
    with open(rec.trace_path) as f:
        assert json.load(f)["traceEvents"]
    assert rec.trace_path.startswith(str(tmp_path))
    assert not torch.autograd.profiler._is_profiler_enabled
    summary = anatomy_summary(rec, floor_bytes=10_000, peak_bw=1e9)
    cal = summary.pop("calibration")  # the rest is plain data
    json.dumps(summary)
    assert cal is not None and cal.steps >= 1 and cal.gap_ns  # steps matched to the bus
    assert [row["step"] for row in summary["steps"]] == [s.step for s in rec.steps]
    assert summary["steps"][0]["floor_us"] == pytest.approx(10.0)
    assert summary["families"] and summary["trace"]["traceEvents"]


def test_refuses_bad_requests_and_times_out_on_an_idle_engine(tiny_model_dir, tmp_path):
    eng = Engine(EngineConfig(model=str(tiny_model_dir("llama")), **CFG))
    try:
        with pytest.raises(ValueError, match="n_steps must be an integer in 1..256"):
            record_anatomy(eng, 0)
        with pytest.raises(TimeoutError, match="serving requests"):
            record_anatomy(eng, 2, timeout_s=0.2, trace_dir=str(tmp_path))
        # The abandoned request is gone: a new one can start and complete.
        done = threading.Event()
        out = {}

        def rec() -> None:
            out["r"] = record_anatomy(eng, 2, timeout_s=60, trace_dir=str(tmp_path))
            done.set()

        t = threading.Thread(target=rec)
        t.start()
        eng.generate([[1, 2, 3]], SamplingParams(max_tokens=30, temperature=0.0,
                                                 ignore_eos=True))
        t.join(60)
        assert done.is_set() and len(out["r"].steps) == 2
    finally:
        eng.shutdown()


def join_report(events: list[dict], step: int) -> str:
    """What the trace holds for one recorded step, to see why its kernels did or did not join
    it: its range, the runtime calls inside it, the first kernels after its start (with their
    args), and the trace's categories."""
    from collections import Counter

    from telemetry.anatomy import STEP_MARKER

    rng = [e for e in events if e.get("ph") == "X" and e.get("name") == f"{STEP_MARKER}{step}"
           and e.get("cat") != "gpu_user_annotation"]
    if not rng:
        return f"step {step}: no range in the trace"
    a, tid = float(rng[0]["ts"]), rng[0].get("tid")
    b = a + float(rng[0].get("dur", 0))
    calls = [(e["name"], round(float(e["ts"]) - a, 1), e.get("tid"), (e.get("args") or {}))
             for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
             and a <= float(e["ts"]) <= b]
    kernels = sorted((float(e["ts"]) - a, str(e["name"])[:48], e.get("args"))
                     for e in events if e.get("cat") == "kernel" and float(e["ts"]) >= a)[:4]
    cats = Counter(str(e.get("cat")) for e in events)
    return (f"step {step}: range {a:.1f}..{b:.1f} us (tid {tid}, cat {rng[0].get('cat')}); "
            f"{len(calls)} runtime calls in it, first 8: {calls[:8]}; first kernels after its "
            f"start: {kernels}; categories {dict(cats)}")


@pytest.mark.cuda
@pytest.mark.parametrize("graphs", [True, False])
def test_on_cuda_kernels_join_their_step_and_lie_inside_our_compute_span(tiny_model_dir,
                                                                        tmp_path, graphs):
    """The recorded kernels of each step (grouped by the launch calls' correlation ids: one
    cudaGraphLaunch for a graph step) lie within what our compute span measured for that
    step: a graph step's in-graph events bracket its kernels tightly; an eager step's stream
    events may start early by the first op's CPU dispatch (documented in streams.py)."""
    eng = Engine(EngineConfig(model=str(tiny_model_dir("llama")), device="cuda",
                              dtype="bfloat16", max_num_seqs=4, max_num_batched_tokens=32,
                              block_size=16, num_blocks=64, max_model_len=128,
                              cuda_graphs=graphs))
    try:
        assert eng.settings()["cuda_graphs"] is graphs, eng.settings()["cuda_graphs_reason"]
        handles = [eng.submit([3, 4, 5, 6 + i], SamplingParams(
            max_tokens=60, temperature=0.0, ignore_eos=True)) for i in range(4)]
        # GAPLESS_TEST_TRACE_DIR keeps the trace for a look off the GPU machine
        rec = record_anatomy(eng, 6, timeout_s=60, trace_dir=os.environ.get(
            "GAPLESS_TEST_TRACE_DIR", str(tmp_path)))
        for h in handles:
            h.result(timeout=60)
        ours = {r.step: r for r in eng.bus.snapshot_steps(1000)}
    finally:
        eng.shutdown()
    assert rec.device == "cuda" and len(rec.steps) == 6
    with_marker = {m.step: m for m in group_by_step(
        rec.events, device_cats=("kernel", "gpu_memcpy", "gpu_memset"), keep_marker=True)}
    from engine.instruments.kernel_sampler import lost_launches

    print(join_report(rec.events, rec.steps[0].step))
    print(f"recorded again: {rec.retried}")
    for s in rec.steps:
        assert len(s.kernels) > 5, (
            f"step {s.step}: kernels not found by correlation (kernels per recorded step "
            f"{[(x.step, len(x.kernels)) for x in rec.steps]}; the trace holds "
            f"{lost_launches(rec.events)} kernel launches without a record: the profiler "
            "dropped them, pytorch issue 192021)")
        r = ours[s.step]
        assert (r.graph_bucket is not None) is graphs
        (comp,) = [x for x in r.spans if x.lane == "compute"]
        ours_us = comp.duration_ns / 1000
        print(f"step {s.step}: ours {ours_us:.1f} us, kernels {s.span_us:.1f} us")
        assert ours_us >= s.span_us - 2, (ours_us, s.span_us)  # the kernels lie inside
        if not graphs:
            assert ours_us - s.span_us <= max(0.25 * s.span_us, 200), (ours_us, s.span_us)
            continue
        # A graph step's span runs from its start event, recorded inside the graph right
        # after the marker kernel, to its end event after the last kernel. Under the
        # profiler, a graph launched onto an idle stream starts its body up to a few hundred
        # us after the marker (more in sync mode than in async), so the span is checked from
        # the marker's end: a synthetic graph's events match marker end..last kernel end
        # within 0.1 us under the same profiler.
        marker = [k for k in with_marker[s.step].kernels if k.family == "marker"]
        assert len(marker) == 1, [k.name for k in with_marker[s.step].kernels[:3]]
        from_marker = max(k.end_us for k in s.kernels) - marker[0].end_us
        body_gap = min(k.start_us for k in s.kernels) - marker[0].end_us
        print(f"  from the marker's end {from_marker:.1f} us (body starts {body_gap:.1f} us "
              "after it)")
        assert abs(ours_us - from_marker) <= 5, (ours_us, from_marker, body_gap)
    # The first recording was good: no session of ours started before its trace was written
    # (engine/instruments/profiler_sessions.py: a sampler session started in between would
    # leave every CUDA event of this graph recording at ts 0).
    assert rec.retried is None, rec.retried
