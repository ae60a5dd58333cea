"""The step pipeline: slots, and launching a step across the three streams.

Owns the per-slot buffers (pinned host input, device input, device output, pinned host
output) and the events that say when a slot may be reused, and the launch order:

    h2d:     wait(slot's last compute_done) -> copy host -> device -> record h2d_done
    compute: wait(h2d_done), wait(slot's last d2h_done) -> step -> record compute_done
    d2h:     wait(compute_done) -> copy sampled tokens -> record d2h_done

The CPU blocks only in `wait_results` (one d2h_done per step) and, when a slot is reused
before its last step's results were read (one slot in async mode), in `wait_host_input`.
It never decides what runs: see engine.loop.

Timing (telemetry on): each op is timed by events on its stream; a CUDA-graph replay also
hands over the events recorded inside its graph, so its compute span starts at the graph's
first kernel and the launch latency before it is a compute.launch span. An observer
(engine.step.protocols.StepObserver: the instruments) may wrap a step's launch and its
compute; without one a launch costs one attribute test more.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.core.batch import BufferLayout, HostView, StepMeta
from engine.core.scheduler import SchedulerOutput
from engine.step.protocols import StepObserver
from engine.step.runner import DeviceView
from engine.step.slot_guard import SlotGuards
from engine.step.streams import Event, Stream, StreamSet, TimedOp
from telemetry.records import StepRecord


@dataclass(slots=True)
class Slot:
    index: int
    host_buf: torch.Tensor
    host: HostView
    dev: DeviceView
    host_out: torch.Tensor
    host_out_np: np.ndarray
    h2d_done: Event | None = None
    compute_done: Event | None = None
    d2h_done: Event | None = None
    inflight: InflightStep | None = None  # launched, results not yet read
    guards: SlotGuards | None = None  # generation counters of the four buffers

    @classmethod
    def allocate(cls, index: int, layout: BufferLayout, device: torch.device) -> Slot:
        pin = device.type == "cuda"
        host_buf = torch.zeros(layout.size, dtype=torch.int32, pin_memory=pin)
        host_out = torch.zeros(layout.max_seqs, dtype=torch.int64, pin_memory=pin)
        return cls(
            index=index,
            host_buf=host_buf,
            host=HostView(host_buf.numpy(), layout),
            dev=DeviceView.allocate(layout, device),
            host_out=host_out,
            host_out_np=host_out.numpy(),
            guards=SlotGuards.for_slot(index),
        )


@dataclass(slots=True)
class InflightStep:
    step: int
    slot: Slot
    sched: SchedulerOutput
    meta: StepMeta
    record: StepRecord
    d2h_done: Event
    ops: list[TimedOp] = field(default_factory=list)
    error: BaseException | None = None


class TimedLaunch:
    """The launch-latency part of a timed op that has inner events: the loop reads it as a
    span of its own lane ("compute.launch") beside the op's span."""

    __slots__ = ("lane", "op")

    def __init__(self, lane: str, op: TimedOp) -> None:
        self.lane = lane
        self.op = op

    def span_ns(self) -> tuple[int, int]:
        span = self.op.launch_span_ns()
        if span is None:  # the op fell back to its stream events: nothing before it
            start, _ = self.op.span_ns()
            return start, start
        return span

    def launch_span_ns(self) -> tuple[int, int] | None:
        return None


class Pipeline:
    def __init__(
        self,
        streams: StreamSet,
        layout: BufferLayout,
        num_slots: int,
        timing: bool = True,
        observer: StepObserver | None = None,
    ) -> None:
        self.streams = streams
        self.layout = layout
        # With telemetry off, no timing events are recorded around the step's work.
        self.timing = timing
        self.observer = observer
        self.slots: list[Slot] = []
        self.resize(num_slots)

    def resize(self, num_slots: int) -> None:
        """Only between steps, with nothing in flight."""
        assert all(s.inflight is None for s in self.slots)
        while len(self.slots) > num_slots:
            self.slots.pop()
        while len(self.slots) < num_slots:
            self.slots.append(Slot.allocate(len(self.slots), self.layout, self.streams.device))

    def slot_for(self, step: int) -> Slot:
        return self.slots[step % len(self.slots)]

    def wait_host_input(self, slot: Slot) -> int:
        """The host input buffer is free once the slot's last H2D copy finished. If that
        step's results were already read, its H2D is known to be done: no wait, so in steady
        state the CPU blocks on one event per step (d2h_done). Returns how long the CPU
        waited here, ns (0 when it did not)."""
        if slot.h2d_done is not None and slot.inflight is not None:
            t = time.perf_counter_ns()
            slot.h2d_done.synchronize()
            return time.perf_counter_ns() - t
        return 0

    def claim_host_input(self, slot: Slot, step: int) -> None:
        """The CPU is about to write `step`'s inputs into the slot: raises SlotOverwriteError
        if the slot's last H2D copy may still be reading them."""
        slot.guards.host_in.claim(step, slot.h2d_done)  # type: ignore[union-attr]

    def launch(
        self,
        slot: Slot,
        sched: SchedulerOutput,
        meta: StepMeta,
        record: StepRecord,
        compute_fn: Callable[[], None],
    ) -> InflightStep:
        obs = self.observer
        if obs is None:
            return self._launch(slot, sched, meta, record, compute_fn)
        ctx = obs.before_launch(record.step)
        compute_fn = obs.around_compute(record.step, compute_fn)
        if ctx is None:
            return self._launch(slot, sched, meta, record, compute_fn)
        with ctx:  # kernels find their step through the launch calls made inside it
            return self._launch(slot, sched, meta, record, compute_fn)

    def _launch(
        self,
        slot: Slot,
        sched: SchedulerOutput,
        meta: StepMeta,
        record: StepRecord,
        compute_fn: Callable[[], None],
    ) -> InflightStep:
        assert slot.inflight is None, "slot reused before its results were read"
        s = self.streams
        h2d_done, compute_done, d2h_done = s.event(), s.event(), s.event()
        ops: list[TimedOp] = []
        error: BaseException | None = None
        g, n = slot.guards, record.step
        assert g is not None
        if slot.compute_done is not None:
            # device input still read by the slot's last step (ordering only)
            s.h2d.order_after(slot.compute_done)

        def h2d() -> None:
            g.host_in.check(n)
            g.dev_in.claim(n)
            slot.dev.buf.copy_(slot.host_buf, non_blocking=True)
            if not s.is_cuda:  # on CUDA the copy is still queued: h2d_done releases it
                g.host_in.release(n)

        self._queue(s.h2d, "h2d", h2d, ops)
        s.h2d.record(h2d_done)
        s.compute.wait(h2d_done)
        if slot.d2h_done is not None:
            # device output still read by the slot's last D2H (ordering only)
            s.compute.order_after(slot.d2h_done)

        def compute() -> None:  # on CUDA this runs at launch, in launch order
            g.dev_in.check(n)
            g.dev_out.claim(n)
            compute_fn()
            g.dev_in.release(n)

        # A graph replay's in-graph events stay visible to the timed op (see _queue).
        compute.device_events = getattr(compute_fn, "device_events", None)  # type: ignore[attr-defined]
        try:
            self._queue(s.compute, "compute", compute, ops)
        except Exception as e:  # CUDA launches run here, in the calling thread
            error = e
        s.compute.record(compute_done)
        s.d2h.wait(compute_done)

        def d2h() -> None:
            g.dev_out.check(n)
            g.host_out.claim(n)
            slot.host_out.copy_(slot.dev.out, non_blocking=True)
            g.dev_out.release(n)

        self._queue(s.d2h, "d2h", d2h, ops)
        s.d2h.record(d2h_done)
        slot.h2d_done, slot.compute_done, slot.d2h_done = h2d_done, compute_done, d2h_done
        step = InflightStep(record.step, slot, sched, meta, record, d2h_done, ops, error)
        slot.inflight = step
        return step

    def _queue(self, stream: Stream, lane: str, fn: Callable[[], None],
               ops: list[TimedOp]) -> None:
        if self.timing:
            # A graph replay (engine.step.graphs.GraphReplay) carries events recorded inside
            # its graph: the span then starts at its first kernel, and the launch latency
            # before it becomes a span of its own (see TimedLaunch).
            inner = getattr(fn, "device_events", None) if self.streams.is_cuda else None
            op = stream.timed(lane, fn, inner)
            ops.append(op)
            if inner is not None:
                ops.append(TimedLaunch(lane + ".launch", op))
        else:
            stream.submit(fn)

    def wait_results(self, step: InflightStep) -> np.ndarray:
        """Block until the step's tokens are on the host; returns a copy of them. Raises
        what the step's device work raised."""
        guards = step.slot.guards
        assert guards is not None
        try:
            step.d2h_done.synchronize()
        except BaseException:
            guards.reset()  # its readers may have been skipped; nothing of it is in flight
            raise
        finally:
            step.slot.inflight = None  # read, or failed: either way the slot is free again
        if step.error is not None:
            guards.reset()
            raise step.error
        guards.host_out.check(step.step)
        tokens = step.slot.host_out_np[: step.meta.num_samples].copy()
        guards.host_out.release(step.step)
        return tokens
