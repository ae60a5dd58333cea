"""On a CUDA GPU: timing events recorded inside a captured graph give each graph step a
compute span that lies inside the step's stream-ordered work (after its H2D copy, before
its D2H copy), and a compute.launch span before it; eager steps keep stream-event spans."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.step.graphs import GraphCache

pytestmark = pytest.mark.cuda


def _lanes(rec):
    out = {}
    for s in rec.spans:
        out.setdefault(s.lane, []).append(s)
    return out


def test_in_graph_events_time_the_graph_not_the_launch():
    """A graph of GEMMs replayed behind a busy stream: the in-graph span starts after the
    stream's own start event (the launch waited for the earlier work) and is as long as the
    GEMMs, read after each replay without a sync inside the step."""
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()

    def compute(_view, _t, _s, _g):
        x = a
        for _ in range(8):
            x = x @ a

    cache = GraphCache([1], compute, stream, max_samples=1)
    assert cache.capture_all([(0, None)]), cache.failure
    replay = cache.replay_fn(0, 1, True)
    first, last = replay.device_events
    before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    spans = []
    for _ in range(3):
        with torch.cuda.stream(stream):
            big = torch.randn(4096, 4096, device="cuda")
            before.record(stream)
            big @ big  # queued after `before`: the graph must wait for it
            replay()
            after.record(stream)
        after.synchronize()
        spans.append((before.elapsed_time(first), first.elapsed_time(last),
                      last.elapsed_time(after)))
    for wait_ms, graph_ms, tail_ms in spans:
        assert wait_ms > 0.05  # the 4096^3 fp32 GEMM ran between `before` and the graph
        assert graph_ms > 0.01
        assert tail_ms >= 0
    graph_times = [g for _, g, _ in spans]
    assert max(graph_times) < 3 * min(graph_times)  # re-recorded by every replay


def test_engine_graph_steps_have_truthful_compute_spans(tiny_model_dir):
    cfg = EngineConfig(model=str(tiny_model_dir("llama")), device="cuda", dtype="bfloat16",
                       max_num_seqs=4, max_num_batched_tokens=32, block_size=16,
                       num_blocks=64, max_model_len=96, cuda_graphs=True, async_batching=True)
    with Engine(cfg) as eng:
        assert eng.settings()["cuda_graphs"], eng.settings()["cuda_graphs_reason"]
        prompts = [[5, 6, 7, 8]] * 4
        eng.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
        graph_recs = [r for r in eng.bus.snapshot_steps(1000) if r.graph_bucket is not None]
        eng.configure(cuda_graphs=False)
        eng.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        eager = [r for r in eng.bus.snapshot_steps(1000)[-3:] if r.graph_bucket is None]
    assert len(graph_recs) >= 10
    for rec in graph_recs:
        lanes = _lanes(rec)
        (h2d,), (launch,), (comp,), (d2h,) = (lanes["h2d"], lanes["compute.launch"],
                                             lanes["compute"], lanes["d2h"])
        assert launch.end_ns == comp.start_ns
        assert h2d.end_ns <= launch.start_ns + 1000  # ns rounding of two event reads
        assert comp.start_ns <= comp.end_ns <= d2h.start_ns + 1000
        assert comp.duration_ns > 0
    assert eager and all("compute.launch" not in _lanes(r) for r in eager)
