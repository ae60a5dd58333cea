"""A kernel sample reaches the bus on the record of the step that closed its window, never on a
later, unrelated one: the records from that step on wait while the sample converts and are
published in order once it is ready (or lost). And the instruments take turns at the
profiler: an anatomy recording asked for drops the kernel sampler's sample in progress."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from engine.instruments import kernel_sampler
from engine.instruments import profiler_sessions as sessions
from engine.instruments.anatomy import AnatomyRecorder
from engine.instruments.kernel_sampler import KernelSampler
from engine.instruments.observer import Instruments, SamplePublisher
from telemetry.bus import TelemetryBus
from telemetry.records import RequestEvent, StepRecord


def _rec(step: int, mode: str = "async") -> StepRecord:
    return StepRecord(step=step, mode=mode, slot=0, num_requests=1, prefill_tokens=0,  # type: ignore[arg-type]
                      decode_tokens=1)


def _wait(cond, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.002)
    assert cond()


def test_a_sample_rides_on_the_record_of_the_step_that_closed_its_window(monkeypatch):
    release = threading.Event()
    sample = SimpleNamespace(skipped_steps=0)  # a KernelSample as the worker sees it

    def convert(*job):
        release.wait(5)
        return sample

    monkeypatch.setattr(kernel_sampler, "convert", convert)
    sampler = KernelSampler(enabled=False)
    bus = TelemetryBus()
    pub = SamplePublisher(bus, sampler)
    pub.publish_step(_rec(9))
    # The sampler stops after step 10's results were read (its window's end): the records
    # from step 10 on wait for its sample, events do not.
    sampler._submit((None, 5, 4, {}, 0, {}), sessions.hold())
    for step in (10, 11):
        pub.publish_step(_rec(step))
    pub.publish_event(RequestEvent("r", "tokens", 1, 1))
    assert [r.step for r in bus.snapshot_steps(10)] == [9]
    assert len(bus.snapshot_events(10)) == 1
    # A settings change in between: the sync step's record must not carry the async sample.
    pub.publish_step(_rec(12, mode="sync"))
    release.set()
    _wait(lambda: not sampler.converting)
    pub.publish_step(_rec(13, mode="sync"))
    got = bus.snapshot_steps(10)
    assert [r.step for r in got] == [9, 10, 11, 12, 13]
    assert [r.kernel_samples for r in got] == [[], [sample], [], [], []]
    sampler.close()


def test_held_records_go_out_when_the_engine_idles_and_when_a_sample_is_lost(monkeypatch):
    release = threading.Event()

    def convert(*job):
        release.wait(5)
        raise ValueError("a bad trace")

    monkeypatch.setattr(kernel_sampler, "convert", convert)
    sampler = KernelSampler(enabled=False)
    inst = Instruments(cuda=False, kernels=sampler)
    bus = TelemetryBus()
    pub = inst.publisher(bus)
    sampler._submit((None, 5, 4, {}, 0, {}), sessions.hold())
    pub.publish_step(_rec(10))
    assert inst.idle() is False and bus.snapshot_steps(10) == []
    release.set()
    _wait(lambda: not sampler.converting)
    assert inst.idle() is False
    got = bus.snapshot_steps(10)
    assert [(r.step, r.kernel_samples) for r in got] == [(10, [])]
    assert sampler.failures == 1 and not sessions.unsaved()
    sampler.close()


def test_an_anatomy_recording_asked_for_drops_the_sample_in_progress(monkeypatch):
    stopped = []
    sampler = KernelSampler(enabled=True, period_s=0.05)
    monkeypatch.setattr(sampler, "_stop", lambda keep: stopped.append(keep))
    sampler.open = True  # a sample is being recorded
    inst = Instruments(cuda=False, kernels=sampler)
    monkeypatch.setattr(AnatomyRecorder, "_start", lambda self: None)  # no profiler here
    inst.anatomy.warmup = sampler.warmup = 0  # record from the next step on
    inst.anatomy.request(1, "/tmp")
    assert inst.before_launch(7) is None  # host streams: the range wraps the compute
    assert stopped == [False]  # dropped, not kept
    ran = []
    fn = inst.around_compute(7, lambda: ran.append(1))
    fn()
    assert ran == [1] and fn.__name__ == "run"  # anatomy.marked's wrapper
    def other() -> None:
        pass

    assert inst.around_compute(8, other) is other  # that step only
