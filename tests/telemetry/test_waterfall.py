"""The step waterfall's arithmetic on recorded steps (the H200 8B recording, and a small
hand-made pair of steps): its parts add up to the window, kernel time comes from the
measured kernels of sampled steps, and without samples only the host's side is split."""

from __future__ import annotations

import pytest

from telemetry.kernels import KernelRecord, SampledStep, make_sample
from telemetry.records import Span, StepRecord
from telemetry.waterfall import COMPONENTS, UNSPLIT, WaterfallMeter, host_phases, waterfall
from ui.figures.recordings import RECORDINGS_DIR, load_recording


def step(n: int, t0: int, comp: tuple[int, int], mode: str = "sync") -> StepRecord:
    """A step whose CPU schedules at t0, launches, and whose compute runs ``comp``."""
    return StepRecord(step=n, mode=mode, slot=n % 2, num_requests=1, prefill_tokens=0,
                      decode_tokens=1, graph_bucket=1, spans=[
                          Span("cpu.schedule", t0, t0 + 10), Span("cpu.prepare", t0 + 10,
                                                                  t0 + 30),
                          Span("cpu.launch", t0 + 30, t0 + 40), Span("h2d", t0 + 40, t0 + 45),
                          Span("compute.launch", t0 + 45, comp[0]),
                          Span("compute", *comp), Span("d2h", comp[1], comp[1] + 5),
                          Span("cpu.wait", t0 + 40, comp[1] + 6),
                          Span("cpu.post", comp[1] + 6, comp[1] + 20)])


def sampled(n: int, kernels: list[tuple[int, int]]) -> SampledStep:
    return SampledStep(n, [KernelRecord("nvjet_gemm", "gemm", a, b) for a, b in kernels])


def test_parts_add_up_and_kernels_are_the_measured_ones():
    a = step(0, 0, (50, 150))
    b = step(1, 170, (220, 320))
    # step 0 measured: 60 ns inside kernels over its 100 ns span; step 1 not sampled
    sample = make_sample([sampled(0, [(50, 80), (100, 130)])], next_start_ns=None)
    wf = waterfall([a, b], 0, 400, [sample], floor_ns=lambda r: 20.0)
    assert wf.total_ns == wf.window_ns == 400
    assert wf.step_busy_ns == 200
    assert wf.kernel_ns == 120  # 60 measured + step 1: the sampled step's 60 ns of kernels
    assert wf.parts_ns["floor"] == 40 and wf.parts_ns["kernels_above_floor"] == 80
    assert wf.parts_ns["in_step_gaps"] == 80
    idle = sum(wf.parts_ns[k] for k in ("idle_cpu", "idle_launch", "copies_sync", "no_work"))
    assert idle == 200


def test_the_floor_part_comes_from_the_records_own_floor_by_default():
    """An engine on a GPU puts each step's byte floor on its record (StepRecord.floor_ns):
    the Live page and /metrics split kernel time by it without knowing the model."""
    a, b = step(0, 0, (50, 150)), step(1, 170, (220, 320))
    a.floor_ns = b.floor_ns = 20
    sample = make_sample([sampled(0, [(50, 80), (100, 130)])], next_start_ns=None)
    wf = waterfall([a, b], 0, 400, [sample])
    assert wf.parts_ns["floor"] == 40 and wf.parts_ns["kernels_above_floor"] == 80
    b.floor_ns = 0  # a step whose floor is unknown adds none
    assert waterfall([a, b], 0, 400, [sample]).parts_ns["floor"] == 20
    a.kernel_samples = [sample]  # /metrics' meter reads samples from the records
    meter = WaterfallMeter()
    assert meter.add([a])["floor"] == 20
    assert meter.add([b])["floor"] == 0 and meter.totals_ns["floor"] == 20


def with_context(r: StepRecord, ctx: int) -> StepRecord:
    r.chunks = [("req-0", 1, ctx)]
    return r


def test_unsampled_steps_get_the_sampled_kernel_time_not_its_share_of_a_stretched_span():
    """A sampled graph step's span is stretched by the profiler (its body starts well after
    the marker), its kernels are not: an unsampled step of the same key gets the sampled
    kernel time (60), not the sampled share of its own span (60/200 of 100 = 30)."""
    a = step(0, 0, (50, 250))  # sampled, span 200
    b = step(1, 300, (350, 450))  # not sampled, span 100
    sample = make_sample([sampled(0, [(50, 60), (200, 250)])], next_start_ns=None)
    wf = waterfall([b], 300, 500, [sample], sampled_records=[a])
    assert wf.kernel_ns == 60 and wf.parts_ns["in_step_gaps"] == 40
    assert wf.total_ns == wf.window_ns == 200
    # without the sampled step's record its key is unknown: the share of all samples
    assert waterfall([b], 300, 500, [sample]).kernel_ns == 30
    # never more than the step's own span: its kernels lie inside it
    short = step(2, 600, (650, 690))
    assert waterfall([short], 600, 700, [sample], sampled_records=[a]).kernel_ns == 40


def test_kernel_time_follows_the_context_between_sampled_steps():
    """Attention time grows with context: an unsampled step gets the sampled steps' time
    interpolated at its context, the nearest one's outside their range."""
    s0, s1 = with_context(step(0, 0, (50, 150)), 100), with_context(step(1, 200, (250, 350)), 300)
    sample = make_sample([sampled(0, [(50, 110)]), sampled(1, [(250, 330)])], None)

    def at(ctx: int) -> int | None:
        r = with_context(step(5, 1000, (1050, 1150)), ctx)
        return waterfall([r], 1000, 1200, [sample], sampled_records=[s0, s1]).kernel_ns

    assert at(200) == 70 and at(100) == 60 and at(250) == 75
    assert at(50) == 60 and at(400) == 80  # outside: the nearest sampled context


def test_a_step_of_an_unsampled_key_takes_the_sampled_steps_of_its_token_count():
    """The eager step that captures a batch's graphs (or any step of a key not sampled yet)
    runs the same kernels as the batch's graph steps: it gets their kernel time at its
    context, not the share of all samples times its long span (which would read a capture
    step as almost all kernels)."""
    a = with_context(step(0, 0, (50, 250)), 100)  # sampled graph step (bucket 1), span 200
    sample = make_sample([sampled(0, [(50, 60), (200, 250)])], next_start_ns=None)  # 60 ns
    capture = with_context(step(1, 300, (350, 1350)), 100)  # eager, 1000 ns span
    capture.graph_bucket = None
    wf = waterfall([capture], 300, 1400, [sample], sampled_records=[a])
    assert wf.kernel_ns == 60 and wf.parts_ns["in_step_gaps"] == 940
    # another token count has no sampled step: the share of all samples (60/200 of 1000)
    other = with_context(step(2, 300, (350, 1350)), 100)
    other.graph_bucket, other.decode_tokens = None, 2
    assert waterfall([other], 300, 1400, [sample], sampled_records=[a]).kernel_ns == 300


def test_without_samples_the_kernel_parts_are_unknown_and_the_host_is_split():
    a, b = step(0, 0, (50, 150)), step(1, 170, (220, 320))
    wf = waterfall([a, b], 0, 400)
    assert wf.kernel_ns is None and wf.parts_ns["floor"] is None
    host = host_phases([a, b], 0, 400)
    assert sum(host.values()) == 400 and host["cpu.schedule"] == 20


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_on_the_h200_recording_with_sampled_steps_the_parts_sum_to_the_wall(mode):
    rec = load_recording(RECORDINGS_DIR / "h200-llama-8b.jsonl")
    steps = [r for r in rec.steps if r.mode == mode and r.graph_bucket is not None][:60]
    assert len(steps) >= 20
    # pretend every 10th step was sampled: its compute span is 90% inside kernels
    samples = []
    for r in steps[::10]:
        (c,) = [s for s in r.spans if s.lane == "compute"]
        mid = c.start_ns + (c.end_ns - c.start_ns) // 2
        samples.append(make_sample([sampled(r.step, [(c.start_ns, mid - (c.duration_ns // 20)),
                                                     (mid + c.duration_ns // 20, c.end_ns)])],
                                   None))
    comp = [s for r in steps for s in r.spans if s.lane == "compute"]
    lo, hi = min(s.start_ns for s in comp), max(s.end_ns for s in comp)
    wf = waterfall(steps, lo, hi, samples, floor_ns=lambda r: 0.5 * 1e6)
    assert abs(wf.total_ns - wf.window_ns) <= 0.01 * wf.window_ns
    assert wf.kernel_ns == pytest.approx(0.9 * wf.step_busy_ns, rel=0.02)
    if mode == "sync":  # sync waits for each step's D2H and post: copies and sync show
        assert wf.parts_ns["copies_sync"] > 0


def test_the_meter_accumulates_batches_to_the_wall_time():
    steps = [step(n, 200 * n, (200 * n + 50, 200 * n + 150)) for n in range(6)]
    steps[0].kernel_samples = [make_sample([sampled(0, [(50, 140)])], None)]
    meter = WaterfallMeter()
    meter.add(steps[:3])
    meter.add(steps[3:])
    total = sum(meter.totals_ns.values())
    assert total == 1150 - 50  # first compute start to last compute end
    assert meter.totals_ns[UNSPLIT] == 0 and set(COMPONENTS) <= set(meter.totals_ns)
    empty = WaterfallMeter()
    empty.add([step(0, 0, (50, 150)), step(1, 200, (250, 350))])
    assert empty.totals_ns[UNSPLIT] == 200


def test_the_meter_gives_unsampled_steps_the_kernel_time_of_earlier_sampled_ones():
    """A sample rides on a later record than its steps, often in a later batch: the meter
    keeps the sampled steps' records for their key, so the next batch's steps get the
    sampled kernel time per step (60 ns) and not the sampled share of their span."""
    steps = [step(n, 300 * n, (300 * n + 50, 300 * n + 250)) for n in range(3)]  # span 200
    steps += [step(n, 300 * n, (300 * n + 50, 300 * n + 150)) for n in range(3, 5)]  # 100
    steps[2].kernel_samples = [make_sample([sampled(0, [(50, 80), (200, 230)])], None)]
    meter = WaterfallMeter()
    meter.add(steps[:3])  # step 0's record leaves the meter's two-record tail here
    added = meter.add(steps[3:])
    kernel = added["floor"] + added["kernels_above_floor"]
    assert kernel == 120  # 2 steps x 60 ns (the share would give 2 x 30)
