"""A tensor-parallel engine's per-rank lanes get rows of their own on the timeline (after the
device lanes, by rank), in their own legend group; a straggler rank's longer compute shows."""

from __future__ import annotations

from telemetry.records import LANES, Span, StepRecord
from ui.figures.lanes import RANKS_GROUP, lane_group
from ui.figures.timeline import GPU_ONLY_LANES, lane_bars, lanes_of, timeline_figure


def record(step: int, t0: int, slow_rank1_ns: int) -> StepRecord:
    spans = [
        Span("compute", t0, t0 + 1_000_000),
        Span("rank0.comm", t0 + 400_000, t0 + 400_000 + slow_rank1_ns),
        Span("rank1.compute", t0, t0 + 1_000_000 + slow_rank1_ns),
        Span("rank1.comm", t0 + 900_000, t0 + 950_000),
    ]
    return StepRecord(step=step, mode="async", slot=0, num_requests=1, prefill_tokens=0,
                      decode_tokens=1, spans=spans)


def test_rank_lanes_follow_the_device_lanes_by_rank():
    recs = [record(0, 0, 0)]
    cpu = tuple(lane for lane in LANES if lane not in GPU_ONLY_LANES)
    assert lanes_of(recs) == cpu + ("rank0.comm", "rank1.compute", "rank1.comm")
    assert lanes_of([StepRecord(0, "sync", 0, 0, 0, 0)]) == cpu  # one rank: no new rows
    assert lane_group("rank1.compute") == RANKS_GROUP


def test_figure_draws_a_row_per_rank_lane_and_the_straggler_is_longer():
    recs = [record(i, i * 3_000_000, slow_rank1_ns=500_000) for i in range(4)]
    fig = timeline_figure(recs, legend=True)
    assert list(fig.layout.yaxis.ticktext)[-3:] == ["rank0.comm", "rank1.compute", "rank1.comm"]
    names = [t.name.split(":")[0] for t in fig.data]
    assert names[-3:] == ["rank0.comm", "rank1.compute", "rank1.comm"]
    bars = lane_bars(recs, lanes=lanes_of(recs))
    rank1 = (bars["rank1.compute"].end_ns - bars["rank1.compute"].start_ns).mean()
    rank0 = (bars["compute"].end_ns - bars["compute"].start_ns).mean()
    assert rank1 > rank0  # the straggler's row is visibly longer
