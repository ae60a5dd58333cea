"""Streams and events: one interface, a CUDA implementation and a host emulation.

Owns ordering device work. `Stream.submit(fn)` queues work on the stream; `record(event)`
and `wait(event)` order streams along a data dependency (an error of the work before the
event fails the work after it), `order_after(event)` only orders (a slot's buffers being
free: an earlier step's failure must not fail the next step that merely reuses its slot);
`Event.synchronize()` is the only way the CPU blocks.
`Stream.timed(lane, fn)` queues fn and returns a TimedOp whose start/end host-clock times
can be read once the work is known to be done (telemetry adds no sync).

Where the work is a CUDA graph replay that carries its own timing events (recorded inside
the captured graph, see engine.step.graphs), `timed(lane, fn, inner=...)` reads the span
from those: it then starts at the graph's first node and ends after its last kernel, and
`TimedOp.launch_span_ns()` gives the stretch before it (the stream reached the step, the
graph had not started yet: launch latency). Events recorded on the stream around an eager
compute fn fire when the stream reaches them; the first kernel follows as soon as the CPU
has launched it, so eager spans start up to one op's CPU dispatch time (~10 us) early when
the stream was idle, and exactly at the first kernel when it was busy (async).

On CUDA, work is launched from the calling thread inside `torch.cuda.stream(s)`. Without
CUDA, a stream is a worker thread running its queue in order, an event is a threading event
with a timestamp: the same pipeline code runs and really overlaps on a CPU-only machine.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

import torch

from telemetry.clock import ClockAnchor


class Event(Protocol):
    def synchronize(self) -> None: ...
    def query(self) -> bool: ...


class TimedOp(Protocol):
    lane: str

    def span_ns(self) -> tuple[int, int]: ...
    def launch_span_ns(self) -> tuple[int, int] | None: ...


class Stream(Protocol):
    name: str

    def submit(self, fn: Callable[[], None]) -> None: ...
    def timed(self, lane: str, fn: Callable[[], None], inner: tuple[Event, Event] | None = None,
              ) -> TimedOp: ...
    def record(self, event: Event) -> None: ...
    def wait(self, event: Event) -> None: ...
    def order_after(self, event: Event) -> None: ...


class StreamError(RuntimeError):
    """Work queued on a stream raised; raised again where the CPU waits for it."""


# ------------------------------------------------------------------------ host emulation
class HostEvent:
    __slots__ = ("_flag", "t_ns", "error")

    def __init__(self) -> None:
        self._flag = threading.Event()
        self.t_ns: int | None = None
        self.error: BaseException | None = None

    def set(self, error: BaseException | None = None) -> None:
        self.t_ns = time.perf_counter_ns()
        self.error = error
        self._flag.set()

    def synchronize(self) -> None:
        self._flag.wait()
        if self.error is not None:
            raise StreamError(str(self.error)) from self.error

    def query(self) -> bool:
        return self._flag.is_set()


class HostTimedOp:
    __slots__ = ("lane", "start_ns", "end_ns")

    def __init__(self, lane: str) -> None:
        self.lane = lane
        self.start_ns = 0
        self.end_ns = 0

    def span_ns(self) -> tuple[int, int]:
        return self.start_ns, self.end_ns

    def launch_span_ns(self) -> tuple[int, int] | None:
        return None  # a host stream has no launch latency to show


class HostStream:
    """A worker thread that runs submitted callables in order. If one raises, the stream
    keeps going but skips work until the error has been handed to the next recorded event;
    waiters on that event see it."""

    def __init__(self, name: str) -> None:
        self.name = name
        # Test hook: each timed op takes this much longer, to make this stream the slow one
        # (a pipeline that reuses a slot too early then computes the wrong tokens).
        self.delay_s = 0.0
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"gapless-{name}", daemon=True)
        self._thread.start()

    @property
    def thread_id(self) -> int | None:
        """The worker thread's native id (its CPU times: /proc/self/task/<id>/schedstat)."""
        return self._thread.native_id

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                fn = self._queue.get()
                if fn is None:
                    return
                fn()

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            if self._error is not None:
                return
            try:
                fn()
            except BaseException as e:  # handed to the next event; the engine reports it
                self._error = e

        return run

    def submit(self, fn: Callable[[], None]) -> None:
        def run() -> None:
            if self.delay_s:
                time.sleep(self.delay_s)
            fn()

        self._queue.put(self._guard(run))

    def timed(self, lane: str, fn: Callable[[], None], inner: tuple[Event, Event] | None = None,
              ) -> HostTimedOp:
        op = HostTimedOp(lane)  # inner device events exist only on CUDA

        def run() -> None:
            op.start_ns = time.perf_counter_ns()
            if self.delay_s:
                time.sleep(self.delay_s)
            try:
                fn()
            finally:
                op.end_ns = time.perf_counter_ns()

        self._queue.put(self._guard(run))
        return op

    def record(self, event: Event) -> None:
        assert isinstance(event, HostEvent)

        def run() -> None:
            err, self._error = self._error, None
            event.set(err)

        self._queue.put(run)

    def wait(self, event: Event) -> None:
        self._wait(event, propagate=True)

    def order_after(self, event: Event) -> None:
        self._wait(event, propagate=False)

    def _wait(self, event: Event, propagate: bool) -> None:
        assert isinstance(event, HostEvent)

        def run() -> None:
            event._flag.wait()
            if propagate and event.error is not None and self._error is None:
                self._error = event.error  # propagate along the data dependency

        self._queue.put(run)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)


# ------------------------------------------------------------------------------- CUDA
class CudaTimedOp:
    """Events recorded on the stream around an op, and optionally the op's own events
    (``inner``: first and last, recorded inside a CUDA graph). Read only after the op is
    known to be done, and for ``inner`` before the same graph is replayed again (the loop
    reads a step's spans as soon as its results are in, before its slot is reused)."""

    __slots__ = ("lane", "start", "end", "clock", "inner")

    def __init__(self, lane: str, clock: CudaClock,
                 inner: tuple[torch.cuda.Event, torch.cuda.Event] | None = None) -> None:
        self.lane = lane
        self.clock = clock
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.inner = inner

    def span_ns(self) -> tuple[int, int]:
        to_host = self.clock.to_host_ns
        if self.inner is not None:
            try:
                return to_host(self.inner[0]), to_host(self.inner[1])
            except RuntimeError:  # a driver that cannot time in-graph events: stream events
                self.inner = None
        return to_host(self.start), to_host(self.end)

    def launch_span_ns(self) -> tuple[int, int] | None:
        """From the stream reaching the op to the op's first event (graph launch latency);
        None without inner events."""
        if self.inner is None:
            return None
        try:
            first = self.clock.to_host_ns(self.inner[0])
        except RuntimeError:
            return None
        start = self.clock.to_host_ns(self.start)
        return start, max(start, first)


class CudaClock:
    """Maps CUDA event times onto time.perf_counter_ns through an anchor event recorded on an
    idle device and synchronised against the host clock. The arithmetic (and its error
    bound) is telemetry.clock.ClockAnchor's; this class only makes the CUDA calls."""

    def __init__(self) -> None:
        self.anchor = torch.cuda.Event(enable_timing=True)
        self.mapping = ClockAnchor(0)
        self.reanchor()

    def reanchor(self) -> None:
        """Call only when the device is idle (start, or after the pipeline drained)."""
        torch.cuda.synchronize()
        before = time.perf_counter_ns()
        self.anchor.record()
        self.anchor.synchronize()
        self.mapping = ClockAnchor.from_sync(before, time.perf_counter_ns())

    def to_host_ns(self, event: torch.cuda.Event) -> int:
        return self.mapping.to_host_ns(self.anchor.elapsed_time(event))


class CudaStream:
    def __init__(self, name: str, clock: CudaClock, device: torch.device) -> None:
        self.name = name
        self.clock = clock
        self.stream = torch.cuda.Stream(device=device)

    def submit(self, fn: Callable[[], None]) -> None:
        with torch.cuda.stream(self.stream):
            fn()

    def timed(self, lane: str, fn: Callable[[], None], inner: tuple[Event, Event] | None = None,
              ) -> CudaTimedOp:
        op = CudaTimedOp(lane, self.clock, inner)  # type: ignore[arg-type]
        with torch.cuda.stream(self.stream):
            op.start.record(self.stream)
            fn()
            op.end.record(self.stream)
        return op

    def record(self, event: Event) -> None:
        assert isinstance(event, torch.cuda.Event)
        event.record(self.stream)

    def wait(self, event: Event) -> None:
        assert isinstance(event, torch.cuda.Event)
        self.stream.wait_event(event)

    def order_after(self, event: Event) -> None:
        """The same as wait on CUDA: a failed kernel poisons the whole context, so there is
        no per-step error to keep from propagating (launch errors are kept per step by the
        pipeline)."""
        self.wait(event)

    def close(self) -> None:
        self.stream.synchronize()


class StreamSet:
    """The three streams of the pipeline and a factory for their events."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.is_cuda = device.type == "cuda"
        if self.is_cuda:
            self.clock: CudaClock | None = CudaClock()
            self.h2d: Stream = CudaStream("h2d", self.clock, device)
            self.compute: Stream = CudaStream("compute", self.clock, device)
            self.d2h: Stream = CudaStream("d2h", self.clock, device)
        else:
            self.clock = None
            self.h2d = HostStream("h2d")
            self.compute = HostStream("compute")
            self.d2h = HostStream("d2h")

    def event(self) -> Event:
        return torch.cuda.Event() if self.is_cuda else HostEvent()

    def compute_thread(self) -> int | None:
        """The native id of the thread that runs compute on the host (host streams); None
        on CUDA, where the device runs it."""
        return None if self.is_cuda else self.compute.thread_id  # type: ignore[attr-defined]

    def reanchor(self) -> None:
        if self.clock is not None:
            self.clock.reanchor()

    def close(self) -> None:
        for s in (self.h2d, self.compute, self.d2h):
            s.close()  # type: ignore[attr-defined]
